"""Plans: a background extraction's changes, recorded in its ledger before they are applied.

Applying operations is not idempotent the way adding items is: after a crash,
asking the model again would show it other memories under the same handles
(the first run already superseded or forgot some), so "forget 2" could hit
another memory. The pipeline therefore records each job's resolved changes
(`memory.lifecycle.operations.Change`, as JSON) in the ledger, keyed by the job, before
applying them; a job that finds a plan applies that plan and never runs its
extractor again. The first plan recorded for a key is the plan: a later
`record` keeps it and returns it. A plan holds memory text, so it is dropped
when the job is marked done or lost (and the SQLite ledger deletes securely).

A ledger provides its plans with `plans()` (all of ours do); a third-party
ledger without it still works, with replays asking the extractor again
(logged once per ledger type).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from memory.lifecycle.operations import Change

PLAN_SLOT = "plan"


@runtime_checkable
class PlanBook(Protocol):
    """Where one ledger keeps its jobs' plans (text, one per key)."""

    def record(self, plans: Mapping[str, str]) -> dict[str, str]:
        """Keep each key's first plan; the plans now kept for these keys."""
        ...

    def read(self, keys: list[str]) -> dict[str, str]:
        """The plans recorded for those keys that have one."""
        ...


def encode(changes: list[Change]) -> str:
    return json.dumps([change.model_dump(mode="json") for change in changes], ensure_ascii=False)


def decode(plan: str) -> list[Change]:
    return [Change.model_validate(change) for change in json.loads(plan)]


def plan_book(ledger: Any) -> PlanBook | None:
    """The ledger's plan book, if it keeps one."""
    provide = getattr(ledger, "plans", None)
    book = provide() if callable(provide) else None
    return book if isinstance(book, PlanBook) else None


class SqlitePlans:
    """Plans in the SQLite ledger's file (table `plans`, made by the ledger)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        lock: threading.Lock,
        transaction: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._db, self._lock, self._transaction = db, lock, transaction

    def record(self, plans: Mapping[str, str]) -> dict[str, str]:
        with self._lock, self._transaction():
            self._db.executemany("insert or ignore into plans values (?, ?)", list(plans.items()))
            return self._select(list(plans))

    def read(self, keys: list[str]) -> dict[str, str]:
        with self._lock:
            return self._select(keys)

    def _select(self, keys: list[str]) -> dict[str, str]:
        if not keys:
            return {}
        rows = self._db.execute(
            f"select key, plan from plans where key in ({','.join('?' * len(keys))})", keys
        )
        return dict(rows.fetchall())


class ChromaPlans:
    """Plans in the ledger's collection on a Chroma server, as `<key>/plan` records.

    `add` inserts an id only if it is absent, so the first plan of a key stays.
    """

    def __init__(self, records: Callable[[], Any]) -> None:
        self._records = records

    def record(self, plans: Mapping[str, str]) -> dict[str, str]:
        if plans:
            self._records().add(
                ids=[f"{key}/{PLAN_SLOT}" for key in plans],
                embeddings=[[1.0]] * len(plans),
                metadatas=[{"plan_of": key, "plan": plan} for key, plan in plans.items()],
            )
        return self.read(list(plans))

    def read(self, keys: list[str]) -> dict[str, str]:
        if not keys:
            return {}
        got = self._records().get(ids=[f"{key}/{PLAN_SLOT}" for key in keys], include=["metadatas"])
        return {str(meta["plan_of"]): str(meta["plan"]) for meta in got["metadatas"] if meta}


class ProcessPlans:
    """Plans of a ledger of this process only."""

    def __init__(self) -> None:
        self._plans: dict[str, str] = {}
        self._lock = threading.Lock()

    def record(self, plans: Mapping[str, str]) -> dict[str, str]:
        with self._lock:
            for key, plan in plans.items():
                self._plans.setdefault(key, plan)
            return {key: self._plans[key] for key in plans}

    def read(self, keys: list[str]) -> dict[str, str]:
        with self._lock:
            return {key: self._plans[key] for key in keys if key in self._plans}

    def drop(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._plans.pop(key, None)


def planned_once(ledger: Any, key: str, plan: Callable[[], list[Change]]) -> list[Change] | None:
    """An inline extraction's changes, exactly once: None when the ledger calls `key` done
    (its changes are applied); else the plan recorded for it, or, when there is none yet,
    `plan()` recorded first. A replay after a crash applies the recorded plan and never
    plans again against a store its first run already changed."""
    record = ledger.read([key]).get(key)
    if record is not None and record.state != "running":
        return None
    book = plan_book(ledger)
    if book is None:
        return plan()
    if (recorded := book.read([key]).get(key)) is not None:
        return decode(recorded)
    return decode(book.record({key: encode(plan())})[key])
