"""How memories are found: search, ranking (relevance × decay), the owner's perspective, aliases and the memory block."""
