"""Sealing a store that an earlier version wrote in the clear, once, in processes of its own.

Before `memory.storage.sealing`, documents were stored in the clear. `MemoryStore.open`
looks for such a document in the folder's Chroma file before Chroma opens it
(`has_clear_text`, a read-only look) and, if there is one, `seal_clear_text`:

1. `python -m memory.storage.clear_text seal FOLDER`: each clear document is sealed in
   place with its vector kept, its id queued for the scrub first
   (`memory.storage.erasure.ErasureQueue`); then Chroma is closed and the clear copies it
   kept (its log, its full-text index, freed pages) are scrubbed.
2. `python -m memory.storage.clear_text rebuild FOLDER`: every collection is copied into
   a new one with its vectors (`memory.storage.reembed.rebuild`), so the vector index
   files are written afresh. Chroma writes those files from buffers whose unused
   part holds whatever that memory held before; the earlier version's process,
   and step 1's, held the text, so their index files may too.

Each step runs in a fresh process: no process that writes the final index files
ever held the text. A crash is finished by the next open: the queue is scrubbed
first, what is still clear is sealed, and a rebuild marked pending is run.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from memory.storage.erasure import CHROMA_FILE, CLOSE_WAIT, ErasureQueue, held, scrub_pending
from memory.storage.sealing import SEALED, KeyRing, Sealed

log = logging.getLogger("cyrene.memory")
_PAGE = 500
REBUILD_PENDING = "cyrene_rebuild_pending"
"""A marker in the folder: the index rebuild of a sealing has not finished."""


def has_clear_text(folder: Path) -> bool:
    """Whether the folder's Chroma file holds a document in the clear (read before this
    process's Chroma opens it; with the file held here, a handle already opened it)."""
    chroma = folder / CHROMA_FILE
    if not chroma.exists() or held(folder):
        return False
    db = sqlite3.connect(f"file:{chroma}?mode=ro", uri=True)
    try:
        row = db.execute(
            "select 1 from embedding_metadata where key = 'chroma:document'"
            " and string_value not like ? limit 1",
            (SEALED + "%",),
        ).fetchone()
    except sqlite3.DatabaseError:  # not a store Chroma wrote yet
        return False
    finally:
        db.close()
    return row is not None


def seal_clear_text(folder: Path) -> None:
    """Seal every clear document of the folder, scrub their copies and rebuild its vector
    indexes, each step in a child process (see the module).

    Raises:
        subprocess.CalledProcessError: a step failed (its output in the error).
    """
    log.warning("memory: %s holds text in the clear; sealing it (once)", folder)
    (folder / REBUILD_PENDING).touch()
    _step("seal", folder)
    finish_rebuild(folder)


def finish_rebuild(folder: Path) -> None:
    """Run the index rebuild a sealing left pending (crashed, or not yet run)."""
    if (folder / REBUILD_PENDING).exists():
        _step("rebuild", folder)
        (folder / REBUILD_PENDING).unlink()


def _step(name: str, folder: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "memory.storage.clear_text", name, str(folder)],
        check=True,
        capture_output=True,
        text=True,
    )


def _seal_collection(collection: Any, sealed: Sealed, queue: ErasureQueue) -> int:
    """Seal a collection's clear documents in place (vectors kept); how many."""
    clear: list[tuple[str, str, Any, Any]] = []
    for offset in range(0, collection.count(), _PAGE):
        page: Any = collection.get(
            limit=_PAGE, offset=offset, include=["documents", "metadatas", "embeddings"]
        )
        rows = zip(
            page["ids"], page["documents"], page["metadatas"], page["embeddings"], strict=True
        )
        clear += [row for row in rows if row[1] and not row[1].startswith(SEALED)]
    for start in range(0, len(clear), _PAGE):
        chunk = clear[start : start + _PAGE]
        ids = [row[0] for row in chunk]
        queue.add(ids)  # before the write: a crash after it still scrubs their clear copies
        collection.upsert(
            ids=ids,
            documents=sealed.seal(ids, [row[1] for row in chunk]),
            metadatas=[row[2] for row in chunk],
            embeddings=[row[3] for row in chunk],
        )
    return len(clear)


def _client(folder: Path) -> Any:
    import chromadb
    from chromadb.config import Settings

    # Chroma's client has close(); its API type does not say so.
    return chromadb.PersistentClient(
        path=str(folder), settings=Settings(anonymized_telemetry=False)
    )


def seal(folder: Path) -> int:
    """Step 1: seal the clear documents in place, then scrub their copies; how many."""
    keys, client = KeyRing(folder), _client(folder)
    try:
        count = sum(
            _seal_collection(c, Sealed(keys), ErasureQueue(folder))
            for c in client.list_collections()
        )
    finally:
        client.close()
        keys.close()
    scrub_pending(folder, CLOSE_WAIT)
    return count


def rebuild_all(folder: Path) -> int:
    """Step 2: copy every collection into a new one, vectors kept; records copied."""
    import memory.embedding  # noqa: F401  (registers our embedding functions by name)
    from memory.storage.reembed import rebuild

    client = _client(folder)
    try:
        return sum(rebuild(client, c) for c in client.list_collections())
    finally:
        client.close()


if __name__ == "__main__":
    step, where = sys.argv[1], Path(sys.argv[2])
    print({"seal": seal, "rebuild": rebuild_all}[step](where))
