"""Where checkpoints live, and how their history is kept short.

- `checkpoint`: `open_checkpointer(url)`, the saver factory (memory, SQLite, Postgres);
- `retention`: `prune_checkpoints`, which drops old checkpoints without losing
  the transcript; `retention_tables` reads and deletes their rows per database;
- `archive`: the transcript archive beside the checkpoints;
- `reading`: stored sessions read without the loop (`cyrene history`, `cyrene sessions`).

Names are imported on first use (`nodes.kernel.lazy`): a reader needs no graph machinery.
"""

from typing import TYPE_CHECKING

from nodes.kernel.lazy import lazy_exports

if TYPE_CHECKING:
    from graph.storage.checkpoint import open_checkpointer as open_checkpointer
    from graph.storage.retention import DEFAULT_KEEP as DEFAULT_KEEP
    from graph.storage.retention import PruneReport as PruneReport
    from graph.storage.retention import prune_checkpoints as prune_checkpoints

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DEFAULT_KEEP": "graph.storage.retention",
        "PruneReport": "graph.storage.retention",
        "open_checkpointer": "graph.storage.checkpoint",
        "prune_checkpoints": "graph.storage.retention",
    },
)
__all__ = ["DEFAULT_KEEP", "PruneReport", "open_checkpointer", "prune_checkpoints"]
