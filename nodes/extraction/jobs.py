"""What the background pipeline works on: jobs, their counts, and the turns it gives way to."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memory.items import Source
from nodes.extraction.ledger import ExtractionLedger, Record, extraction_ledger_for

if TYPE_CHECKING:
    from memory.lifecycle.operations import Change

DEFAULT_TIMEOUT = 60.0


@dataclass
class JobStats:
    """Counts of one graph's background extractions (or, from `extraction_stats()`, all)."""

    submitted: int = 0
    """Jobs taken into the queue."""
    succeeded: int = 0
    """Jobs whose memories are stored and marked done."""
    failed: int = 0
    """Attempts whose extractor raised."""
    timed_out: int = 0
    """Attempts that overran their deadline (their late items are discarded)."""
    retried: int = 0
    """Attempts made again after a failure or an overrun."""
    setbacks: int = 0
    """Store or ledger calls a job's work waited on because they failed (the store or its
    ledger down): tried again with backoff, never an attempt, never a loss."""
    lost: int = 0
    """Jobs given up and marked lost in the ledger (each logged at error level)."""
    skipped: int = 0
    """Jobs the ledger already called done or lost (another process, an earlier life)."""
    deferred: int = 0
    """Jobs left pending in their checkpoint because the queue was full."""
    stored: int = 0
    """Memories written."""
    queued: int = 0
    """Jobs in this process not yet settled (filled in by `extraction_stats()`)."""


TOTALS = JobStats()
"""Every graph's counts in this process."""
_STATS_LOCK = threading.Lock()


JobId = tuple[int, str]
"""A job's identity in this process: its store's namespace and its key (`job_id`)."""

_NAMESPACES: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_NEXT_NAMESPACE = itertools.count()
_NAMESPACES_LOCK = threading.Lock()


def job_id(store: Any, key: str) -> JobId:
    """`key` in `store`'s namespace. A key names a turn within one store's ledger only: two
    stores of one process (two graphs, two tests) may each have a thread "t0" whose message
    "m1" opened a turn, and each must extract it. A number is never reused, unlike `id()`,
    which a later store may get while this process still remembers the earlier one's keys."""
    with _NAMESPACES_LOCK:
        namespace = _NAMESPACES.get(store)
        if namespace is None:
            namespace = _NAMESPACES[store] = next(_NEXT_NAMESPACE)
    return namespace, key


def count(stats: JobStats, name: str, n: int = 1) -> None:
    """Add to a graph's count and to the process total."""
    with _STATS_LOCK:
        for target in (stats, TOTALS):
            setattr(target, name, getattr(target, name) + n)


@dataclass(eq=False)
class ExtractionJob:
    """One turn's background extraction (identity is the object; `key` names the turn)."""

    key: str
    extract: Callable[..., Iterable[Any]]
    """Its changes (`nodes.extraction.planning.plan_extraction`), or plain items / operations to resolve;
    called with `earlier=`: what its session's earlier jobs, planned with it, change."""
    persona_id: str | None
    source: Source
    store: Any
    session: str | None = None
    """The session the turn belongs to: its jobs are planned and applied one at a time."""
    order: int = 0
    """The turn's number in its session: a job waits while an earlier one is in hand."""
    timeout: float = DEFAULT_TIMEOUT
    stats: JobStats = field(default_factory=JobStats)
    abandon: str = ""
    """Why the job cannot run, if so (it is marked lost as soon as the ledger lets it)."""
    attempts: int = 0
    """Claims so far, this one included (from the ledger, so earlier lives count)."""
    claim: Record | None = None
    """This process's claim on the job, as written to the ledger."""
    tried: bool = False
    """Whether the extractor ran under `claim` (a job held back behind an earlier one of its
    session renews its claim without counting an attempt)."""
    changes: list[Change] | None = None
    """Its resolved changes, once extracted (kept until they are applied and marked done)."""
    planned: bool = False
    """Whether `changes` are the plan recorded in the ledger (a replay applies that plan)."""
    setbacks: int = 0
    """Store or ledger calls for this job that failed (the backoff grows with them)."""
    not_before: float = 0.0
    """Monotonic time before which the job is not looked at again (retries, foreign claims)."""
    waiting_since: float = field(default_factory=time.monotonic)
    ident: JobId = field(init=False)
    """What the process holds it by (`job_id`)."""
    lane: tuple[int, str] | None = field(init=False)
    """Its session in its store's namespace: the jobs that go in turn order with it."""

    def __post_init__(self) -> None:
        self.ident = job_id(self.store, self.key)
        self.lane = None if self.session is None else (self.ident[0], self.session)

    @property
    def ledger(self) -> ExtractionLedger:
        return extraction_ledger_for(self.store)

    def count(self, name: str, n: int = 1) -> None:
        count(self.stats, name, n)


class TurnActivity:
    """How many turns are in flight in this process (an embedded Chroma is per process)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = threading.Condition()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Mark a turn in flight for as long as the block runs."""
        with self._idle:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                if not self._active:
                    self._idle.notify_all()

    def wait_for_idle(self, timeout: float) -> bool:
        """Block until no turn runs or `timeout` passes; True when idle."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout=timeout)


TURNS = TurnActivity()


def run_with_deadline(
    extract: Callable[[], Iterable[Any]], timeout: float
) -> list[Any] | BaseException | None:
    """The extractor's output, its exception, or None when it overran.

    It runs on a daemon thread of its own, so a hung model call cannot hold
    a pool worker past the deadline; its late result is simply dropped.
    """
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(list(extract()))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=target, name="cyrene-extract-job", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else None
