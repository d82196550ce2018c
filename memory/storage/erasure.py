"""Erasing a forgotten memory's text from an embedded store's files, with Chroma closed.

Chroma's own delete is not enough on disk. Its embedded SQLite file keeps
- every write in `embeddings_queue` (its write-ahead log, document text
  included in the JSON `metadata` column) until every segment has consumed
  it, which for the vector index can be a long while;
- the full-text index (`embedding_fulltext_search*`), whose deleted entries
  stay in older index segments until they are merged;
- freed pages, holding the deleted rows' bytes, until they are reused.
So after Chroma deletes the records, `scrub` removes the document from their
queue entries (the entries stay, so a segment that replays them still sees the
add and then the delete), merges the full-text index (`optimize`) and `VACUUM`s
the file; the extraction ledger's WAL is checkpointed and truncated, since a
plan once held the text.

One writer to Chroma's files. Chroma's Rust core has a SQLite of its own, and
two SQLite libraries in one process do not see each other's locks: one writing
`chroma.sqlite3` while the other has it open takes the other's journal for a
crash's and rolls it back ("database disk image is malformed"). So `scrub`
runs only while no descriptor of this process holds Chroma's file (`held`):
the store closes its Chroma client under the `Gate` held exclusively, scrubs,
and opens it again. The ids waiting to be scrubbed are recorded first in a
file of our own (`ErasureQueue`, ids only, never text), so a scrub that cannot
run now (another handle of this process has the folder open, a crash) runs at
the last close or at the next open, before Chroma reads the folder.

Not covered: Chroma's vector index files (`data_level0.bin`) hold vectors and
ids, and in the index's unused capacity whatever bytes the process's memory
held there. A probe found text of this process in it (forgotten text of a store
closed earlier in the same process, once of the same store), intermittently.
Chroma rewrites the file from that buffer, so scrubbing it would not last;
a process that must not keep forgotten text anywhere should open each store
in a process of its own.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

CHROMA_FILE = "chroma.sqlite3"
LEDGER_FILE = "cyrene-extractions.sqlite3"
"""The extraction ledger beside an embedded store's files: plans hold memory text, so a
scrub reaches it too."""
QUEUE_FILE = "cyrene_erasure.sqlite3"
CLOSE_WAIT = 2.0
"""Seconds a scrub waits for a closed Chroma client's connections to close (~10 ms here)."""


class Gate:
    """Many shared holders (every call on the store) or one exclusive holder (an erasure,
    a close). Reentrant per thread: a holder may call other gated methods. A shared
    holder may not ask for it exclusively (it would wait for itself)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._owner: int | None = None
        self._held = threading.local()

    def _depth(self) -> int:
        return getattr(self._held, "depth", 0)

    @contextmanager
    def shared(self) -> Iterator[None]:
        if self._depth() or self._owner == threading.get_ident():
            yield  # already inside: this thread's outer hold covers it
            return
        with self._cond:
            self._cond.wait_for(lambda: self._owner is None)
            self._shared += 1
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            yield
            return
        if self._depth():
            raise RuntimeError("a shared holder of the store's gate asked for it exclusively")
        with self._cond:
            self._cond.wait_for(lambda: self._owner is None)
            self._owner = me  # new shared holders wait from here on
            self._cond.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()


F = TypeVar("F", bound=Callable[..., Any])


def gated(method: F) -> F:
    """A store method that holds the store's `Gate` shared for its whole run."""

    @wraps(method)
    def holding(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._gate.shared():
            return method(self, *args, **kwargs)

    return holding  # type: ignore[return-value]


def exclusively(method: F) -> F:
    """A store method that holds the store's `Gate` alone for its whole run."""

    @wraps(method)
    def holding(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._gate.exclusive():
            return method(self, *args, **kwargs)

    return holding  # type: ignore[return-value]


def held(folder: Path) -> bool:
    """Whether a descriptor of this process has the folder's Chroma file open (then no
    connection of ours may write it). Without `/proc` it cannot be told: assumed held."""
    target = str((folder / CHROMA_FILE).resolve())
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return True
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


class ErasureQueue:
    """The ids whose text still has to be scrubbed from a folder's Chroma file (a table
    in a SQLite file of our own: a crash between a delete and its scrub keeps them)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / QUEUE_FILE

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("create table if not exists pending (id text primary key)")
        return db

    def add(self, ids: Sequence[str]) -> None:
        db = self._connect()
        try:
            db.executemany("insert or ignore into pending(id) values (?)", [(i,) for i in ids])
        finally:
            db.close()

    def pending(self) -> list[str]:
        if not self.path.exists():
            return []
        db = self._connect()
        try:
            return [row[0] for row in db.execute("select id from pending")]
        finally:
            db.close()

    def clear(self, ids: Sequence[str]) -> None:
        db = self._connect()
        try:
            db.executemany("delete from pending where id = ?", [(i,) for i in ids])
        finally:
            db.close()


_SCRUB = """
import json, sqlite3, sys
chroma, ledger = sys.argv[1], sys.argv[2]
ids = json.load(sys.stdin)
db = sqlite3.connect(chroma, isolation_level=None)
for start in range(0, len(ids), 500):
    chunk = ids[start:start + 500]
    db.execute(
        "update embeddings_queue set metadata = json_remove(metadata, '$.\\"chroma:document\\"')"
        " where id in (%s) and json_valid(metadata)" % ",".join("?" * len(chunk)), chunk)
db.execute("insert into embedding_fulltext_search(embedding_fulltext_search) values('optimize')")
db.execute("vacuum")
db.close()
if ledger:
    book = sqlite3.connect(ledger)
    book.execute("pragma wal_checkpoint(truncate)")
    book.close()
"""
"""The scrub, run in a process of its own (standard library only, `python -I`): the pages it
reads hold the text, and freed in this process they could be handed to Chroma's next
buffer, which Chroma writes to its index files whole."""


def scrub(folder: Path, ids: Sequence[str]) -> None:
    """Remove the text of these (already deleted) records from the folder's files.

    Only while nothing in this process holds Chroma's file (`held`): the caller
    closed its client, or Chroma has not opened the folder yet.
    """
    if held(folder):
        raise RuntimeError(f"{folder / CHROMA_FILE} is open in this process: not scrubbed")
    ledger = folder / LEDGER_FILE
    subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            _SCRUB,
            str(folder / CHROMA_FILE),
            str(ledger) if ledger.exists() else "",
        ],
        input=json.dumps(list(ids)),
        text=True,
        check=True,
        capture_output=True,
    )


def checkpoint_ledger(folder: Path) -> None:
    """Checkpoint and truncate the extraction ledger's log: a dropped plan's text (secure
    delete zeroes it in the file) may still be in a log frame."""
    ledger = folder / LEDGER_FILE
    if ledger.exists():
        with sqlite3.connect(ledger) as book:
            book.execute("pragma wal_checkpoint(truncate)")
        book.close()


def released(folder: Path, wait: float) -> bool:
    """Whether Chroma's file is free in this process, waiting up to `wait` seconds: a
    closed client's connections close a few milliseconds later, on Chroma's own threads."""
    deadline = time.monotonic() + wait
    while held(folder):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def scrub_pending(folder: Path, wait: float = 0.0) -> int:
    """Scrub what the folder's queue holds once nothing in this process holds Chroma's file
    (waiting up to `wait` seconds for a closed client to let go); how many ids were
    scrubbed (0 when none waited, or another handle still has the folder open)."""
    queue = ErasureQueue(folder)
    ids = queue.pending()
    if not ids or not (folder / CHROMA_FILE).exists() or not released(folder, wait):
        return 0
    scrub(folder, ids)
    queue.clear(ids)
    return len(ids)
