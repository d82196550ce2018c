"""Compaction: keeping the model view under its token budget (the summary, its policy, and the `compact` node)."""
