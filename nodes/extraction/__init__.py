"""Exactly-once memory extraction: the `extract_memory` node, the extractors, the durable ledger and the background pipeline."""
