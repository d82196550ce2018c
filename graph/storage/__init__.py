"""Where checkpoints live, and how their history is kept short.

- `checkpoint`: `open_checkpointer(url)`, the saver factory (memory, SQLite, Postgres);
- `retention`: `prune_checkpoints`, which drops old checkpoints without losing
  the transcript; `retention_tables` reads and deletes their rows per database.
"""

from graph.storage.checkpoint import open_checkpointer
from graph.storage.retention import DEFAULT_KEEP, PruneReport, prune_checkpoints

__all__ = ["DEFAULT_KEEP", "PruneReport", "open_checkpointer", "prune_checkpoints"]
