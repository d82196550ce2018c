"""Background extraction: off the reply path, durable, bounded, and quick to land.

Every turn's background extraction becomes an `ExtractionJob`, keyed by the
turn (the graph records the key in the session's checkpoint before the turn
returns, so a crash never loses it). One process-wide pipeline runs them:

    submit ─▶ claim (ledger) ─▶ extract (thread pool, deadline) ─▶ store items ─▶ mark done (ledger)

- **Exactly once in effect.** A job is claimed in the store's ledger
  (`memory.ledger`) before its extractor runs and marked done right after its
  items are written; a key the ledger calls done (or lost) is never run
  again, and items upsert by content id, so a re-run never duplicates one.
- **Bounded retries.** A failed or overrun attempt is retried after a short
  backoff, up to `MAX_ATTEMPTS` claims in all (a crash mid-attempt counts
  too); then the job is marked lost, logged at error level and counted.
- **Keeps up without slowing turns.** An embedded Chroma call holds the
  interpreter for its whole run (~5 ms a call plus ~0.35 ms an item, measured
  here), so the one writer thread batches every ledger and store write of a
  cycle into a few calls, and runs a cycle when no turn is in flight (`TURNS`)
  or once work has waited `MAX_DEFER` seconds: under steady traffic memories
  land within about two cycles instead of starving. While turns are quiet,
  items go in chunks of `QUIET_CHUNK`, so a turn that starts waits for one
  small chunk at most.
- **Bounded and observable.** At most `QUEUE_CAPACITY` jobs are held; a full
  queue makes `submit` wait up to `SUBMIT_WAIT`, then leaves the job pending
  in its checkpoint for the session's next run (counted as `deferred`).
  `queue_depth()` and `extraction_stats()` show it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from memory.items import MemoryItem, Source
from memory.ledger import Ledger, Record, claimable, ledger_for, this_owner
from memory.policy import stamp

log = logging.getLogger("cyrene.memory")

DEFAULT_TIMEOUT = 60.0
MAX_ATTEMPTS = 3
RETRY_DELAYS = (0.5, 2.0)  # before the 2nd and the 3rd attempt
QUEUE_CAPACITY = 512
SUBMIT_WAIT = 1.0
MAX_DEFER = 0.4
QUIET_CHUNK = 8
BUSY_CHUNK = 64
CLAIM_BATCH = 256
EXTRACT_WORKERS = 8
LEASE_SLACK = 30.0
LEASE_RECHECK = 5.0
_SETTLED_MEMORY = 100_000


@dataclass
class JobStats:
    """Counts of one graph's background extractions (or, from `extraction_stats()`, all)."""

    submitted: int = 0
    """Jobs taken into the queue."""
    succeeded: int = 0
    """Jobs whose memories are stored and marked done."""
    failed: int = 0
    """Attempts that raised (the extractor, the store or the ledger)."""
    timed_out: int = 0
    """Attempts that overran their deadline (their late items are discarded)."""
    retried: int = 0
    """Attempts made again after a failure or an overrun."""
    lost: int = 0
    """Jobs given up after `MAX_ATTEMPTS` (each logged at error level)."""
    skipped: int = 0
    """Jobs the ledger already called done or lost (another process, an earlier life)."""
    deferred: int = 0
    """Jobs left pending in their checkpoint because the queue was full."""
    stored: int = 0
    """Memories written."""
    queued: int = 0
    """Jobs in this process not yet settled (filled in by `extraction_stats()`)."""


_TOTALS = JobStats()
_STATS_LOCK = threading.Lock()


@dataclass(eq=False)
class ExtractionJob:
    """One turn's background extraction."""

    key: str
    extract: Callable[[], Iterable[MemoryItem]]
    persona_id: str | None
    source: Source
    store: Any
    timeout: float = DEFAULT_TIMEOUT
    stats: JobStats = field(default_factory=JobStats)
    attempts: int = 0
    not_before: float = 0.0
    waiting_since: float = field(default_factory=time.monotonic)
    items: list[MemoryItem] = field(default_factory=list)

    @property
    def ledger(self) -> Ledger:
        return ledger_for(self.store)

    def count(self, name: str, n: int = 1) -> None:
        with _STATS_LOCK:
            for stats in (self.stats, _TOTALS):
                setattr(stats, name, getattr(stats, name) + n)


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
    extract: Callable[[], Iterable[MemoryItem]], timeout: float
) -> list[MemoryItem] | BaseException | None:
    """The extractor's items, its exception, or None when it overran.

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


@dataclass
class _Plan:
    """What the ledger says about a cycle's new jobs."""

    claims: list[ExtractionJob] = field(default_factory=list)
    """Nobody holds them: claim and run."""
    skipped: list[ExtractionJob] = field(default_factory=list)
    """Already done or lost."""
    lost: list[ExtractionJob] = field(default_factory=list)
    """Claimed `MAX_ATTEMPTS` times already (their runs died): give up."""
    later: list[tuple[ExtractionJob, float]] = field(default_factory=list)
    """Held by a live claim elsewhere: look again at the given time."""
    unreadable: list[ExtractionJob] = field(default_factory=list)
    """The ledger could not be read: a failed attempt."""


class _Pipeline:
    """The process-wide queue, extractor pool and writer thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inbox: deque[ExtractionJob] = deque()
        self._ready: list[ExtractionJob] = []
        self._failed: list[ExtractionJob] = []
        self._active: dict[str, ExtractionJob] = {}
        self._settled: OrderedDict[str, None] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._writer: threading.Thread | None = None

    # -- what callers see ----------------------------------------------------
    def depth(self) -> int:
        with self._cond:
            return len(self._active)

    def known(self, key: str) -> bool:
        with self._cond:
            return key in self._active or key in self._settled

    def settled(self, key: str) -> bool:
        with self._cond:
            return key in self._settled

    def submit(self, job: ExtractionJob, backlog: bool = False) -> bool:
        """Queue a job (a key already in hand is a no-op); False when the queue stayed full.

        A `backlog` job (recovery at start) is taken even over capacity: the
        backlog is finite, and it must not wait behind itself.
        """
        with self._cond:
            if job.key in self._active or job.key in self._settled:
                return True
            room = backlog or self._cond.wait_for(
                lambda: len(self._active) < QUEUE_CAPACITY, timeout=SUBMIT_WAIT
            )
            if not room:
                job.count("deferred")
                log.warning(
                    "extraction queue full (%d): %s stays pending for its session's next run",
                    QUEUE_CAPACITY,
                    job.key,
                )
                return False
            job.waiting_since = time.monotonic()
            self._active[job.key] = job
            self._inbox.append(job)
            job.count("submitted")
            self._start()
            self._cond.notify_all()
        return True

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._active, timeout=timeout)

    def _start(self) -> None:
        if self._writer is None:
            self._pool = ThreadPoolExecutor(EXTRACT_WORKERS, thread_name_prefix="cyrene-extract")
            self._writer = threading.Thread(target=self._run, name="cyrene-memory-writer")
            self._writer.daemon = True
            self._writer.start()

    # -- the writer thread ---------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                oldest, wake = self._due()
                while oldest is None:
                    self._cond.wait(wake)
                    oldest, wake = self._due()
            # Wait for a moment with no turn in flight, but never longer than MAX_DEFER.
            quiet = TURNS.wait_for_idle(max(0.0, oldest + MAX_DEFER - time.monotonic()))
            try:
                self._cycle(quiet)
            except Exception:  # a bug here must not stop every later extraction
                log.exception("memory writer cycle failed")

    def _due(self) -> tuple[float | None, float | None]:
        """(When the longest-waiting due work became due, seconds until the next retry is due)."""
        now = time.monotonic()
        due = [j.waiting_since for j in (*self._ready, *self._failed)]
        due += [max(j.waiting_since, j.not_before) for j in self._inbox if j.not_before <= now]
        later = [j.not_before - now for j in self._inbox if j.not_before > now]
        return (min(due) if due else None), (min(later) if later else None)

    def _cycle(self, quiet: bool) -> None:
        now = time.monotonic()
        with self._cond:
            ready, self._ready = self._ready, []
            failed, self._failed = self._failed, []
            fresh = [j for j in self._inbox if j.not_before <= now][:CLAIM_BATCH]
            for job in fresh:
                self._inbox.remove(job)
        stored, broken = self._store(ready, quiet)
        plan = self._decide(fresh)
        failed += broken + plan.unreadable
        lost = plan.lost + [j for j in failed if j.attempts >= MAX_ATTEMPTS]
        written = self._record(stored, plan.claims, lost)
        for job in stored:
            if job in written:
                job.count("succeeded")
                job.count("stored", len(job.items))
                self._settle(job)
            else:
                self._retry_or_lose(job)
        for job in plan.skipped:
            job.count("skipped")
            self._settle(job)
        for job in lost:
            self._lose(job)
        for job in failed:
            if job.attempts < MAX_ATTEMPTS:
                job.count("retried")
                self._requeue(job, time.monotonic() + RETRY_DELAYS[min(job.attempts, 2) - 1])
        for job, when in plan.later:
            self._requeue(job, when)
        for job in plan.claims:
            if job in written:
                assert self._pool is not None
                self._pool.submit(self._attempt, job)
            else:
                self._retry_or_lose(job)

    def _store(
        self, ready: list[ExtractionJob], quiet: bool
    ) -> tuple[list[ExtractionJob], list[ExtractionJob]]:
        """Write the ready jobs' items in chunks; (jobs fully stored, jobs whose write failed)."""
        pairs = [(job, item) for job in ready for item in job.items]
        broken: set[ExtractionJob] = set()
        start = 0
        while start < len(pairs):
            if start:
                quiet = TURNS.wait_for_idle(MAX_DEFER)
            chunk = pairs[start : start + (QUIET_CHUNK if quiet else BUSY_CHUNK)]
            start += len(chunk)
            by_store: dict[int, list[tuple[ExtractionJob, MemoryItem]]] = {}
            for pair in chunk:
                by_store.setdefault(id(pair[0].store), []).append(pair)
            for group in by_store.values():
                try:
                    group[0][0].store.add_many([item for _, item in group])
                except Exception:
                    log.exception("background memory write failed")
                    broken.update(job for job, _ in group)
        for job in broken:
            job.count("failed")
        return [j for j in ready if j not in broken], list(broken)

    def _decide(self, fresh: list[ExtractionJob]) -> _Plan:
        """Read the ledger for new jobs and sort them (see `_Plan`)."""
        plan = _Plan()
        for ledger, jobs in _by_ledger(fresh).items():
            try:
                records = ledger.read([j.key for j in jobs])
            except Exception:
                log.exception("extraction ledger could not be read")
                for job in jobs:
                    job.attempts += 1
                    job.count("failed")
                plan.unreadable += jobs
                continue
            wall = time.time()
            for job in jobs:
                record = records.get(job.key)
                if record is not None and record.state != "running":
                    plan.skipped.append(job)
                elif not claimable(record, wall):
                    assert record is not None
                    wait = min(max(record.until - wall, 0.0), LEASE_RECHECK)
                    plan.later.append((job, time.monotonic() + wait))
                elif record is not None and record.attempts >= MAX_ATTEMPTS:
                    job.attempts = record.attempts
                    plan.lost.append(job)
                else:
                    # In-process attempts count too: a ledger that cannot be written stays bounded.
                    job.attempts = max(job.attempts, record.attempts if record else 0) + 1
                    plan.claims.append(job)
        return plan

    def _record(
        self,
        stored: list[ExtractionJob],
        claims: list[ExtractionJob],
        lost: list[ExtractionJob],
    ) -> set[ExtractionJob]:
        """One ledger write per ledger: done, claimed and lost records; the jobs it covered."""
        owner, wall = this_owner(), time.time()
        claimed, done = set(claims), set(stored)
        written: set[ExtractionJob] = set()
        for ledger, jobs in _by_ledger([*stored, *claims, *lost]).items():
            records: dict[str, Record] = {}
            for job in jobs:
                if job in claimed:
                    until = wall + job.timeout + LEASE_SLACK
                    records[job.key] = Record("running", job.attempts, owner, until)
                else:
                    records[job.key] = Record("done" if job in done else "lost", job.attempts)
            try:
                ledger.write(records)
            except Exception:
                log.exception("extraction ledger could not be written")
                continue
            written.update(jobs)
        return written

    # -- one attempt (on a pool thread) ---------------------------------------
    def _attempt(self, job: ExtractionJob) -> None:
        outcome = run_with_deadline(job.extract, job.timeout)
        if outcome is None:
            job.count("timed_out")
            log.warning(
                "memory extraction %s overran %.1fs; its items are discarded", job.key, job.timeout
            )
        elif isinstance(outcome, BaseException):
            job.count("failed")
            log.error("background memory extraction failed", exc_info=outcome)
        else:
            job.items = stamp(outcome, persona_id=job.persona_id, source=job.source)
        with self._cond:
            job.waiting_since = time.monotonic()
            (self._ready if isinstance(outcome, list) else self._failed).append(job)
            self._cond.notify_all()

    # -- settling --------------------------------------------------------------
    def _retry_or_lose(self, job: ExtractionJob) -> None:
        job.count("failed")
        with self._cond:
            job.waiting_since = time.monotonic()
            self._failed.append(job)
            self._cond.notify_all()

    def _requeue(self, job: ExtractionJob, when: float) -> None:
        with self._cond:
            job.not_before = when
            job.items = []
            self._inbox.append(job)
            self._cond.notify_all()

    def _lose(self, job: ExtractionJob) -> None:
        job.count("lost")
        log.error(
            "memory extraction %s (session %s, message %s) failed %d times; its memories are lost",
            job.key,
            job.source.session_id,
            job.source.message_id,
            job.attempts,
        )
        self._settle(job)

    def _settle(self, job: ExtractionJob) -> None:
        self.settle(job.key)

    def settle(self, key: str) -> None:
        """Note `key` as done or lost in this process (no longer in hand)."""
        with self._cond:
            self._active.pop(key, None)
            self._settled[key] = None
            while len(self._settled) > _SETTLED_MEMORY:
                self._settled.popitem(last=False)
            self._cond.notify_all()


def _by_ledger(jobs: list[ExtractionJob]) -> dict[Ledger, list[ExtractionJob]]:
    grouped: dict[Ledger, list[ExtractionJob]] = {}
    for job in jobs:
        grouped.setdefault(job.ledger, []).append(job)
    return grouped


_PIPELINE = _Pipeline()
os.register_at_fork(after_in_child=_PIPELINE.__init__)  # a forked child starts with no threads


class BackgroundJobs:
    """One graph's handle on the process-wide pipeline: its deadline and its counts."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self.stats = JobStats()

    def submit(self, job: ExtractionJob, backlog: bool = False) -> bool:
        """Queue `job` under this graph's deadline and counts; False when it stays pending."""
        job.timeout, job.stats = self.timeout, self.stats
        return _PIPELINE.submit(job, backlog)

    @staticmethod
    def known(key: str) -> bool:
        """Whether this process has the extraction in hand or has settled it."""
        return _PIPELINE.known(key)

    @staticmethod
    def settled(key: str) -> bool:
        """Whether this process saw the extraction done or lost (it need not stay pending)."""
        return _PIPELINE.settled(key)

    def give_up(self, key: str, why: str) -> None:
        """Settle an extraction that cannot run at all: logged at error level and counted lost."""
        log.error("memory extraction %s cannot run (%s); its memories are lost", key, why)
        with _STATS_LOCK:
            self.stats.lost += 1
            _TOTALS.lost += 1
        _PIPELINE.settle(key)


def unfinished(store: Any, keys: list[str]) -> set[str]:
    """Those of `keys` that the store's ledger does not call done or lost."""
    records = ledger_for(store).read(keys) if keys else {}
    return {k for k in keys if k not in records or records[k].state == "running"}


def queue_depth() -> int:
    """Extractions in this process not yet settled (queued, running, or waiting to be written)."""
    return _PIPELINE.depth()


def extraction_stats() -> JobStats:
    """A snapshot of every graph's extraction counts in this process, with the queue depth."""
    return replace(_TOTALS, queued=queue_depth())


def wait_for_extractions(timeout: float | None = None) -> bool:
    """Drain this process's background extraction; True when everything settled in time."""
    return _PIPELINE.wait(timeout)
