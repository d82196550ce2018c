"""Erasing a forgotten memory's text from an embedded store's files.

Chroma's own delete is not enough on disk. Its embedded SQLite file keeps
- every write in `embeddings_queue` (its write-ahead log, document text
  included in the JSON `metadata` column) until every segment has consumed
  it, which for the vector index can be a long while;
- the full-text index (`embedding_fulltext_search*`), whose deleted entries
  stay in older index segments until they are merged;
- freed pages, holding the deleted rows' bytes, until they are reused.
So after Chroma deletes the records, `Eraser.erase` removes the document from
their queue entries (the entries stay, so a segment that replays them still
sees the add and then the delete), merges the full-text index (`optimize`),
and `VACUUM`s the file; the extraction ledger's WAL is checkpointed and
truncated, since a plan once held the text.

Not covered: Chroma's vector index files (`data_level0.bin`) hold vectors and
ids, and in the index's unused capacity whatever bytes the process's memory
held there. A probe found text of this process in it (forgotten text of a store
closed earlier in the same process, once of the same store), intermittently.
Chroma rewrites the file from that buffer, so scrubbing it would not last;
a process that must not keep forgotten text anywhere should open each store
in a process of its own.

Chroma's Rust core has its own SQLite, and POSIX locks do not tell two SQLite
copies in one process apart, so this process must not run a Chroma call while
erasing: `Gate` lets searches and writes share the store and an erasure have
it alone. The connection stays open until the store closes (closing a file
descriptor drops every lock this process holds on that file).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memory.extraction_ledger import LEDGER_FILE

CHROMA_FILE = "chroma.sqlite3"
_DOCUMENT = '$."chroma:document"'


class Gate:
    """Many shared holders (reads, writes) or one exclusive holder (an erasure)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True  # new shared holders wait from here on
            self._cond.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class Eraser:
    """Scrubs deleted records' text from one embedded store's folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._db: sqlite3.Connection | None = None

    def erase(self, ids: list[str]) -> None:
        """Remove the text of these (already deleted) records from the folder's files.

        Call it holding the store's `Gate` exclusively.
        """
        if self._db is None:
            self._db = sqlite3.connect(
                self.folder / CHROMA_FILE, isolation_level=None, check_same_thread=False
            )
        marks = ",".join("?" * len(ids))
        self._db.execute(
            f"update embeddings_queue set metadata = json_remove(metadata, '{_DOCUMENT}')"
            f" where id in ({marks}) and json_valid(metadata)",
            ids,
        )
        self._db.execute(
            "insert into embedding_fulltext_search(embedding_fulltext_search) values('optimize')"
        )
        self._db.execute("vacuum")
        ledger = self.folder / LEDGER_FILE
        if ledger.exists():
            with sqlite3.connect(ledger) as db:
                db.execute("pragma wal_checkpoint(truncate)")
            db.close()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
