"""How memories change: operations, supersede and forget, history, duplicates, naming and values rules, the write policy."""
