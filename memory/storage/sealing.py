"""Sealed memory text: an embedded store's Chroma files hold only ciphertext.

A forgotten memory's text must leave the store's files, and Chroma's own delete
leaves it in several places (its write-ahead log `embeddings_queue`, its
full-text index, freed pages, and the unused capacity of its vector index files,
which Chroma writes from buffers that held recently read documents). Scrubbing
those would mean writing Chroma's SQLite beside Chroma's own SQLite library,
which corrupts the file ("database disk image is malformed"), or closing Chroma
for every forget. So the text is never given to Chroma in the clear: each
record's document is sealed (AES-256-GCM, `cryptography`) with a key of its own,
kept in a SQLite file of ours beside Chroma's (`KeyRing`, `cyrene_keys.sqlite3`,
secure delete). Forgetting destroys the key; whatever copy of the ciphertext
Chroma keeps anywhere is noise from then on (crypto-erasure). Chroma is given
the vectors as well (it cannot embed ciphertext). Measured: with the documents
in the clear, a forgotten text was found in the vector index file after 2 of 10
runs of the lifecycle suite; sealed, in none.

A record's key is its Chroma id: a memory and its copy in the history share
one, an alias (`alias:<id>`) has its own. A Chroma server whose folder is on this
machine (`cyrene studio` serves the data folder) is given the folder's key ring
(`MemoryStore.connect(..., keys=folder)`), so the same holds there. Any other
server gets documents in the clear (`Plain`): its workers share no key ring, and
the server's files are not ours (what a forget leaves there: docs/memory.md
"Lifecycle: facts that change, forgetting, duplicates").
"""

from __future__ import annotations

import base64
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memory.storage.transactions import immediate_transaction

KEYS_FILE = "cyrene_keys.sqlite3"
SEALED = "cyrene:sealed:v1:"
"""How a sealed document starts (a document without it was written in the clear)."""
_NONCE = 12


class Documents(Protocol):
    """How a store's memory text is kept in Chroma's documents."""

    def seal(self, ids: Sequence[str], texts: Sequence[str]) -> list[str]:
        """The documents to store for these records' texts."""
        ...

    def unseal(self, ids: Sequence[str], documents: Sequence[str | None]) -> list[str | None]:
        """The texts these records' documents hold (None: none, or forgotten)."""
        ...

    def forget(self, ids: Sequence[str]) -> None:
        """Make these records' stored text unreadable for good."""
        ...


class Plain:
    """Documents in the clear: a Chroma server's, which every worker reads."""

    def seal(self, ids: Sequence[str], texts: Sequence[str]) -> list[str]:
        return list(texts)

    def unseal(self, ids: Sequence[str], documents: Sequence[str | None]) -> list[str | None]:
        # A document sealed by a process with the folder's key ring cannot be read here:
        # it is no text (never its ciphertext shown as a memory).
        return [None if d and d.startswith(SEALED) else d for d in documents]

    def forget(self, ids: Sequence[str]) -> None:
        """Nothing to destroy: the server deletes the records.

        docs/memory.md "Lifecycle: facts that change, forgetting, duplicates" says what it keeps.
        """


class KeyRing:
    """Per-record keys in a SQLite file of our own (never Chroma's), deleted securely; the
    processes that share a store's folder (a Chroma server `cyrene studio` runs over it,
    its clients) share the ring."""

    def __init__(self, folder: Path) -> None:
        self._db = sqlite3.connect(
            folder / KEYS_FILE, isolation_level=None, check_same_thread=False
        )
        self._db.execute("pragma secure_delete=on")  # a destroyed key's bytes are zeroed
        self._db.execute("pragma journal_mode=wal")
        self._db.execute("create table if not exists keys (id text primary key, key blob)")
        self._lock = threading.Lock()
        self._known: dict[str, bytes] = {}

    def keys(self, ids: Sequence[str], *, create: bool) -> dict[str, bytes]:
        """The keys of these ids that exist (`create`: made for those that do not)."""
        with self._lock:
            missing = [i for i in dict.fromkeys(ids) if i not in self._known]
            self._known.update(self._select(missing))
            absent = [i for i in missing if i not in self._known]
            if create and absent:
                new = {i: AESGCM.generate_key(256) for i in absent}
                # Another process sharing the ring may have made one first: its key stands.
                # One transaction for the batch: one sync, not one a key (autocommit).
                with immediate_transaction(self._db):
                    self._db.executemany("insert or ignore into keys values (?, ?)", new.items())
                self._known.update(self._select(absent))
            return {i: self._known[i] for i in ids if i in self._known}

    def _select(self, ids: Sequence[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            found.update(self._db.execute(f"select id, key from keys where id in ({marks})", chunk))
        return found

    def destroy(self, ids: Sequence[str]) -> None:
        """Delete these keys; the file keeps none of their bytes."""
        with self._lock:
            for record_id in ids:
                self._known.pop(record_id, None)
            with immediate_transaction(self._db):
                self._db.executemany("delete from keys where id = ?", [(i,) for i in ids])
            self._db.execute("pragma wal_checkpoint(truncate)")

    def close(self) -> None:
        with self._lock:
            self._db.close()


class Sealed:
    """Documents sealed with a key per record (`KeyRing`): an embedded store's."""

    def __init__(self, keys: KeyRing) -> None:
        self._keys = keys

    def seal(self, ids: Sequence[str], texts: Sequence[str]) -> list[str]:
        keys = self._keys.keys(ids, create=True)
        return [_seal(keys[i], i, text) for i, text in zip(ids, texts, strict=True)]

    def unseal(self, ids: Sequence[str], documents: Sequence[str | None]) -> list[str | None]:
        sealed = [i for i, d in zip(ids, documents, strict=True) if d and d.startswith(SEALED)]
        keys = self._keys.keys(sealed, create=False) if sealed else {}
        return [_unseal(keys.get(i), i, d) for i, d in zip(ids, documents, strict=True)]

    def forget(self, ids: Sequence[str]) -> None:
        self._keys.destroy(ids)


def _seal(key: bytes, record_id: str, text: str) -> str:
    nonce = os.urandom(_NONCE)
    # The id is authenticated with the text: a sealed document copied to another record
    # (another persona's bucket, say) does not open there.
    sealed = AESGCM(key).encrypt(nonce, text.encode(), record_id.encode())
    return SEALED + base64.b64encode(nonce + sealed).decode()


def _unseal(key: bytes | None, record_id: str, document: str | None) -> str | None:
    """The text of a document: a sealed one opened with its record's key (None once the key
    is destroyed), one written in the clear as it is."""
    if document is None or not document.startswith(SEALED):
        return document
    if key is None:
        return None
    raw = base64.b64decode(document[len(SEALED) :])
    try:
        return AESGCM(key).decrypt(raw[:_NONCE], raw[_NONCE:], record_id.encode()).decode()
    except InvalidTag:
        return None
