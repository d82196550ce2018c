"""The extraction ledger: which background extractions ran, who is running one, which were lost.

A turn's pending extraction is recorded in its session's checkpoint; this
ledger is the other half of "exactly once". It lives where the memories do,
so a process that can write a memory can also say that the extraction behind
it is done, and every process sharing the store sees it. A memory backend
provides it (`extraction_ledger()`, `memory.protocols.ProvidesExtractionLedger`);
`MemoryStore` gives

- for an embedded store, a SQLite file in the store's folder (one process holds
  the folder, so one process writes it). An embedded Chroma write holds the
  interpreter for its whole run, fsync included (5-25 ms a call here), and
  the ledger is written every cycle; Python's sqlite3 lets go of it;
- for a Chroma server, a small collection on the server, shared by every
  worker. It has no `bucket` in its metadata, so the store's reads and
  migration never take it for memories.

A backend that provides none gets a ledger of this process only (logged once
per backend type), since there is nowhere shared to keep it.

One record per extraction key:
- `running` — claimed by `owner` until `until` (wall clock); `attempts` counts claims;
- `done` — its memories are stored: never run again;
- `lost` — it failed `attempts` times: never run again (the loss was logged and counted).

A claim by another process is honoured while its owner holds the lease
(`memory.lease.holder_alive`: until it expires, unless the owner is visibly
gone: a process on this host whose pid no longer runs or is a zombie, or an
earlier life of this very pid). So a worker killed mid-extraction hands its
work on at once to a restart on the same machine, and after the lease on
another.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from memory.lease import Holder, holder_alive

log = logging.getLogger("cyrene.memory")

LEDGER_COLLECTION = "cyrene_extraction_ledger"
LEDGER_FILE = "cyrene-extractions.sqlite3"
_SQL_BATCH = 500
_POINT = [1.0]  # Chroma wants a vector per record; the ledger is only ever read by id

State = Literal["running", "done", "lost"]


@dataclass(frozen=True)
class Record:
    """What the ledger knows about one extraction."""

    state: State
    attempts: int = 0
    owner: str = ""
    until: float = 0.0


class ExtractionLedger(Protocol):
    """Batch reads and writes of extraction records (one call each, whatever the batch)."""

    def read(self, keys: list[str]) -> dict[str, Record]:
        """The records of those keys that have one."""
        ...

    def write(self, records: Mapping[str, Record]) -> None:
        """Create or replace records."""
        ...


class SqliteExtractionLedger:
    """The ledger of an embedded store: a SQLite file next to Chroma's own."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute("pragma synchronous=normal")  # WAL: a process crash loses nothing
        self._db.execute(
            "create table if not exists extractions (key text primary key, state text not null,"
            " attempts integer not null, owner text not null, until real not null)"
        )

    def read(self, keys: list[str]) -> dict[str, Record]:
        found: dict[str, Record] = {}
        with self._lock:
            for start in range(0, len(keys), _SQL_BATCH):
                batch = keys[start : start + _SQL_BATCH]
                rows = self._db.execute(
                    "select key, state, attempts, owner, until from extractions"
                    f" where key in ({','.join('?' * len(batch))})",
                    batch,
                )
                found.update((row[0], Record(*row[1:])) for row in rows)
        return found

    def write(self, records: Mapping[str, Record]) -> None:
        with self._lock, self._db:  # one transaction
            self._db.executemany(
                "insert or replace into extractions values (?, ?, ?, ?, ?)",
                [(k, r.state, r.attempts, r.owner, r.until) for k, r in records.items()],
            )


class ChromaExtractionLedger:
    """The ledger as a collection on the memory store's Chroma server."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._collection: Any = None

    def _records(self) -> Any:
        if self._collection is None:
            self._collection = self._client.get_or_create_collection(
                LEDGER_COLLECTION, embedding_function=None, metadata={"cyrene": "ledger"}
            )
        return self._collection

    def read(self, keys: list[str]) -> dict[str, Record]:
        if not keys:
            return {}
        got = self._records().get(ids=keys, include=["metadatas"])
        return {
            key: Record(
                state=meta["state"],
                attempts=int(meta.get("attempts", 0)),
                owner=str(meta.get("owner", "")),
                until=float(meta.get("until", 0.0)),
            )
            for key, meta in zip(got["ids"], got["metadatas"], strict=True)
        }

    def write(self, records: Mapping[str, Record]) -> None:
        if not records:
            return
        self._records().upsert(
            ids=list(records),
            embeddings=[_POINT] * len(records),
            metadatas=[
                {"state": r.state, "attempts": r.attempts, "owner": r.owner, "until": r.until}
                for r in records.values()
            ],
        )


class ProcessExtractionLedger:
    """For a memory backend that provides no ledger: this process only, gone on exit."""

    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._lock = threading.Lock()

    def read(self, keys: list[str]) -> dict[str, Record]:
        with self._lock:
            return {k: self._records[k] for k in keys if k in self._records}

    def write(self, records: Mapping[str, Record]) -> None:
        with self._lock:
            self._records.update(records)


_LEDGERS: weakref.WeakKeyDictionary[Any, ExtractionLedger] = weakref.WeakKeyDictionary()
_LEDGERS_LOCK = threading.Lock()
_WARNED: set[type] = set()


def extraction_ledger_for(store: Any) -> ExtractionLedger:
    """The ledger that goes with a memory backend (asked for once per backend object)."""
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get(store)
        if ledger is None:
            ledger = _LEDGERS[store] = _new_ledger(store)
        return ledger


def _new_ledger(store: Any) -> ExtractionLedger:
    provide = getattr(store, "extraction_ledger", None)
    if callable(provide):
        return provide()
    if type(store) not in _WARNED:
        _WARNED.add(type(store))
        log.warning(
            "memory backend %s provides no extraction_ledger(): pending extractions are "
            "recorded in checkpoints, but their completion only in this process",
            type(store).__name__,
        )
    return ProcessExtractionLedger()


def this_owner() -> str:
    """This process as a claim's owner, `host/pid/life` (a fork is a new owner)."""
    return str(Holder.this_process())


def claimable(record: Record | None, now: float) -> bool:
    """A record this process may claim: none yet, or a claim that is ours (a retry; the
    process holds each key once), or whose owner no longer holds its lease."""
    if record is None:
        return True
    if record.state != "running":
        return False
    owner = record.owner
    return owner == this_owner() or not holder_alive(Holder.parse(owner), record.until, now)
