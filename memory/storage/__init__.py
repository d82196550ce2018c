"""How memories are kept in Chroma: records, collection layout, sealed text, erasure, re-embedding and the store's lock."""
