"""The extraction ledger: which background extractions ran, who is running one, which were lost.

A turn's pending extraction is recorded in its session's checkpoint; this
ledger is the other half of "exactly once". It lives where the memories do,
so a process that can write a memory can also say that the extraction behind
it is done, and every process sharing the store sees it. A memory backend
provides it (`extraction_ledger()`, `ProvidesExtractionLedger`);
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
- `lost` — it failed `attempts` times, or cannot run: never run again (the
  loss is logged and counted once this mark is written).

**Claims are atomic.** Two processes that read the same free record (two
recoveries after a SIGKILL) must not both run the extraction, so a claim is a
compare-and-swap (`ExtractionLedger.swap`): the new record is written only if
the key's record is still the one the claimer read. SQLite does it in one
`BEGIN IMMEDIATE` transaction; a Chroma server, which has no transactions,
with an insert that only the first writer wins (see `ChromaExtractionLedger`).
Done and lost marks are final and written outright.

A claim by another process is honoured while its owner holds the lease
(`nodes.kernel.lease.holder_alive`: until it expires, unless the owner is visibly
gone: a process on this host whose pid no longer runs or is a zombie, or an
earlier life of this very pid). So a worker killed mid-extraction hands its
work on at once to a restart on the same machine, and after the lease on
another.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import weakref
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from memory.storage.erasure import LEDGER_FILE
from memory.storage.transactions import immediate_transaction
from nodes.kernel.lease import Holder, holder_alive

log = logging.getLogger("cyrene.memory")

LEDGER_COLLECTION = "cyrene_extraction_ledger"
_SQL_BATCH = 500
_POINT = [1.0]  # Chroma wants a vector per record; the ledger is only ever read by id and key
_END = "end"

State = Literal["running", "done", "lost"]


@dataclass(frozen=True)
class Record:
    """What the ledger knows about one extraction."""

    state: State
    attempts: int = 0
    owner: str = ""
    until: float = 0.0


Swap = tuple[Record | None, Record]
"""(the record a claimer read, None when there was none; the record it writes in its place)."""


@runtime_checkable
class ExtractionLedger(Protocol):
    """Batch reads and writes of extraction records (one call each, whatever the batch)."""

    def read(self, keys: list[str]) -> dict[str, Record]:
        """The records of those keys that have one."""
        ...

    def swap(self, changes: Mapping[str, Swap]) -> set[str]:
        """Claim: write each new record only while the key's record is still the expected one.

        Atomic per key (a transaction or a conditional write): of several
        processes that read the same record and swap it, exactly one succeeds.
        The pipeline swaps only `running` records, each with more `attempts`
        than the record it replaces.

        Returns:
            The keys whose new record was written.
        """
        ...

    def write(self, records: Mapping[str, Record]) -> None:
        """Mark extractions finished (`done` or `lost` records), whatever their record was."""
        ...


class SqliteExtractionLedger:
    """The ledger of an embedded store: a SQLite file next to Chroma's own."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        # Autocommit: every transaction below is begun explicitly, as `begin immediate`.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute("pragma synchronous=normal")  # WAL: a process crash loses nothing
        self._db.execute("pragma secure_delete=on")  # a dropped plan's memory text is zeroed
        self._db.execute(
            "create table if not exists extractions (key text primary key, state text not null,"
            " attempts integer not null, owner text not null, until real not null)"
        )
        self._db.execute(
            "create table if not exists plans (key text primary key, plan text not null)"
        )

    def plans(self) -> Any:
        """Its jobs' plans, in the same file (`nodes.extraction.plans`)."""
        from nodes.extraction.plans import SqlitePlans

        return SqlitePlans(self._db, self._lock, self._transaction)

    def read(self, keys: list[str]) -> dict[str, Record]:
        with self._lock:
            return self._select(keys)

    def swap(self, changes: Mapping[str, Swap]) -> set[str]:
        with self._lock, self._transaction():
            current = self._select(list(changes))
            won = {key for key, (old, _) in changes.items() if current.get(key) == old}
            self._put({key: changes[key][1] for key in won})
        return won

    def write(self, records: Mapping[str, Record]) -> None:
        with self._lock, self._transaction():
            self._put(records)
            self._db.executemany("delete from plans where key = ?", [(k,) for k in records])

    def _transaction(self) -> AbstractContextManager[None]:
        return immediate_transaction(self._db)

    def _select(self, keys: list[str]) -> dict[str, Record]:
        found: dict[str, Record] = {}
        for start in range(0, len(keys), _SQL_BATCH):
            batch = keys[start : start + _SQL_BATCH]
            rows = self._db.execute(
                "select key, state, attempts, owner, until from extractions"
                f" where key in ({','.join('?' * len(batch))})",
                batch,
            )
            found.update((row[0], Record(*row[1:])) for row in rows)
        return found

    def _put(self, records: Mapping[str, Record]) -> None:
        self._db.executemany(
            "insert or replace into extractions values (?, ?, ?, ?, ?)",
            [(k, r.state, r.attempts, r.owner, r.until) for k, r in records.items()],
        )


class ChromaExtractionLedger:
    """The ledger as a collection on the memory store's Chroma server.

    Chroma has no transactions and its `upsert` is last-writer-wins, so a
    claim is made with `add`, which inserts an id only if it is absent: the
    server appends writes to its log and applies them in log order, an `add`
    of an id that exists changes nothing, and a write returns once it is
    applied. Each claim of a key is a record of its own, `<key>/<n>`, where n
    is one more than the `attempts` of the record it replaces: processes that
    read the same record race for the same id, exactly one wins, and each
    learns which by reading the id back. One that read an older record aims at
    an id that the record after it already holds, and loses too. Done and lost
    marks are final and go to `<key>/end`.

    A key's record is its `end` record if it has one, else its claim with the
    most attempts; a record written before claims had ids of their own (id =
    the key) still counts.
    """

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
        latest: dict[str, tuple[float, Record]] = {}
        pages = [self._records().get(ids=keys, include=["metadatas"])]  # the unversioned ones
        for start in range(0, len(keys), _SQL_BATCH):
            batch = keys[start : start + _SQL_BATCH]
            pages.append(self._records().get(where={"key": {"$in": batch}}, include=["metadatas"]))
        for page in pages:
            for record_id, meta in zip(page["ids"], page["metadatas"], strict=True):
                key, _, slot = record_id.partition("/")
                record = _record(meta)
                rank = math.inf if record.state != "running" else int(slot or record.attempts)
                if key not in latest or rank > latest[key][0]:
                    latest[key] = (rank, record)
        return {key: record for key, (_, record) in latest.items()}

    def swap(self, changes: Mapping[str, Swap]) -> set[str]:
        if not changes:
            return set()
        slots = {
            key: f"{key}/{old.attempts + 1 if old else 1}" for key, (old, _) in changes.items()
        }
        self._records().add(
            ids=list(slots.values()),
            embeddings=[_POINT] * len(slots),
            metadatas=[_metadata(key, new) for key, (_, new) in changes.items()],
        )
        ends = [f"{key}/{_END}" for key in changes]
        got = self._records().get(ids=[*slots.values(), *ends], include=["metadatas"])
        held = dict(zip(got["ids"], got["metadatas"], strict=True))
        return {
            key
            for key, (_, new) in changes.items()
            if f"{key}/{_END}" not in held and same_claim(_record(held.get(slots[key]) or {}), new)
        }

    def write(self, records: Mapping[str, Record]) -> None:
        if not records:
            return
        if any(r.state == "running" for r in records.values()):
            raise ValueError("a claim is taken with swap(), never written outright")
        self._records().upsert(
            ids=[f"{key}/{_END}" for key in records],
            embeddings=[_POINT] * len(records),
            metadatas=[_metadata(key, r) for key, r in records.items()],
        )
        self._records().delete(ids=[f"{key}/plan" for key in records])  # memory text goes

    def plans(self) -> Any:
        """Its jobs' plans, in the same collection (`nodes.extraction.plans`)."""
        from nodes.extraction.plans import ChromaPlans

        return ChromaPlans(self._records)


def _metadata(key: str, record: Record) -> dict[str, Any]:
    return {
        "key": key,
        "state": record.state,
        "attempts": record.attempts,
        "owner": record.owner,
        "until": record.until,
    }


def _record(meta: Mapping[str, Any]) -> Record:
    return Record(
        state=meta.get("state", "running"),
        attempts=int(meta.get("attempts", 0)),
        owner=str(meta.get("owner", "")),
        until=float(meta.get("until", 0.0)),
    )


class ProcessExtractionLedger:
    """For a memory backend that provides no ledger: this process only, gone on exit."""

    def __init__(self) -> None:
        from nodes.extraction.plans import ProcessPlans

        self._records: dict[str, Record] = {}
        self._lock = threading.Lock()
        self._plans = ProcessPlans()

    def plans(self) -> Any:
        """Its jobs' plans, in this process too (`nodes.extraction.plans`)."""
        return self._plans

    def read(self, keys: list[str]) -> dict[str, Record]:
        with self._lock:
            return {k: self._records[k] for k in keys if k in self._records}

    def swap(self, changes: Mapping[str, Swap]) -> set[str]:
        with self._lock:
            won = {k for k, (old, _) in changes.items() if self._records.get(k) == old}
            self._records.update((k, changes[k][1]) for k in won)
        return won

    def write(self, records: Mapping[str, Record]) -> None:
        with self._lock:
            self._records.update(records)
        self._plans.drop(list(records))


_LEDGERS: weakref.WeakKeyDictionary[Any, ExtractionLedger] = weakref.WeakKeyDictionary()
_LEDGERS_LOCK = threading.Lock()
_WARNED: set[type] = set()


@runtime_checkable
class ProvidesExtractionLedger(Protocol):
    """The optional part of a `MemoryBackend`: where its background extractions are recorded.

    The pipeline asks once per backend object and keeps the answer. Put the
    ledger where the memories are (a table or collection beside them), so
    every process that writes this backend's memories sees which extractions
    are done. A backend without this method gets a ledger of this process
    only (`ProcessExtractionLedger`; logged once). `MemoryStore` needs none: its
    ledger is made here (`extraction_ledger_for`).
    """

    def extraction_ledger(self) -> ExtractionLedger:
        """The ledger that records this backend's background extractions."""
        ...


def extraction_ledger_for(store: Any) -> ExtractionLedger:
    """The ledger that goes with a memory backend (asked for once per backend object)."""
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get(store)
        if ledger is None:
            ledger = _LEDGERS[store] = _new_ledger(store)
        return ledger


def _new_ledger(store: Any) -> ExtractionLedger:
    ledger = _store_ledger(store)
    if ledger is None:
        provide = getattr(store, "extraction_ledger", None)
        ledger = provide() if callable(provide) else None
    if isinstance(ledger, ExtractionLedger):
        return ledger
    if type(store) not in _WARNED:
        _WARNED.add(type(store))
        if ledger is not None:
            log.error(
                "%s.extraction_ledger() gave a %s, which is not an ExtractionLedger (read, "
                "swap, write): its claims could not be atomic, so this process keeps its own",
                type(store).__name__,
                type(ledger).__name__,
            )
        else:
            log.warning(
                "memory backend %s provides no extraction_ledger(): pending extractions are "
                "recorded in checkpoints, but their completion only in this process",
                type(store).__name__,
            )
    return ProcessExtractionLedger()


def _store_ledger(store: Any) -> ExtractionLedger | None:
    """Our own store's ledger: a SQLite file beside an embedded store's Chroma files (one
    process holds the folder), or a collection on the Chroma server every worker shares."""
    from memory.store import MemoryStore

    if not isinstance(store, MemoryStore):
        return None
    if store.folder is not None:
        return SqliteExtractionLedger(store.folder / LEDGER_FILE)
    return ChromaExtractionLedger(store.client)


def same_claim(record: Record | None, claim: Record) -> bool:
    """Whether `record` is that claim (its expiry aside: a float may come back from a
    server a digit short)."""
    return record is not None and (record.state, record.attempts, record.owner) == (
        claim.state,
        claim.attempts,
        claim.owner,
    )


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
