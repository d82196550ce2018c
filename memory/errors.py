"""The memory layer's expected failures.

They share one base, `MemoryStoreError`, so a front end (the CLI, a worker)
can show any of them as a one-line message instead of a traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memory.items import MemoryItem


class MemoryStoreError(Exception):
    """An expected failure of the memory store: its message says what to do."""


class StoreInUseError(MemoryStoreError):
    """Another process has the embedded store open (Chroma's embedded mode has one writer)."""


class StoreLayoutError(MemoryStoreError):
    """A collection does not hold the bucket its name stands for (never read from it)."""


class MemoryWriteError(MemoryStoreError):
    """Some memories of a batch could not be stored; every other one was.

    Attributes:
        stored: ids of the items that were written, in batch order.
        failed: each item that could not be written, with its exception.
    """

    def __init__(self, stored: list[str], failed: list[tuple[MemoryItem, BaseException]]) -> None:
        self.stored = stored
        self.failed = failed
        total = len(stored) + len(failed)
        shown = "; ".join(f"{item.id}: {exc}" for item, exc in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        super().__init__(
            f"{len(failed)} of {total} memories could not be stored "
            f"(the other {len(stored)} were): {shown}{more}"
        )
