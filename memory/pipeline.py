"""The process-wide extraction pipeline: one queue, an extractor pool, one writer thread.

    submit ─▶ claim (ledger) ─▶ extract (pool, deadline) ─▶ store items ─▶ mark done (ledger)

The writer works in cycles. A cycle takes everything that waited: it writes
the extracted items, reads the ledger for new jobs, and records in one ledger
write the jobs now done, claimed or lost; then it starts the claimed ones.

An embedded Chroma call holds the interpreter for its whole run (here about
5 ms a call plus 0.35 ms an item), so the writer gives way to turns:
- before every store or ledger call it sleeps `YIELD` (a turn that is
  starting gets to register in `TURNS`) and then waits for no turn in flight,
  but only until the cycle's deadline: `MAX_DEFER` after the oldest waiting
  work arrived, and after the previous cycle. Under steady traffic a cycle
  therefore comes every `MAX_DEFER` with everything that waited, instead of
  starving;
- cycles are at least `MIN_GAP` apart, so turn-by-turn work is batched;
- items go in chunks of `QUIET_CHUNK` while no turn runs (a turn that starts
  waits for one small chunk at most) and of `BUSY_CHUNK` once forced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from memory.extraction_ledger import ExtractionLedger, Record, claimable, this_owner
from memory.items import MemoryItem
from memory.jobs import TURNS, ExtractionJob, run_with_deadline
from memory.policy import stamp

log = logging.getLogger("cyrene.memory")

MAX_ATTEMPTS = 3
RETRY_DELAYS = (0.5, 2.0)  # before the 2nd and the 3rd attempt
QUEUE_CAPACITY = 512
SUBMIT_WAIT = 1.0
MAX_DEFER = 0.4
MIN_GAP = 0.2
YIELD = 0.002
QUIET_CHUNK = 8
BUSY_CHUNK = 64
CLAIM_BATCH = 256
EXTRACT_WORKERS = 8
LEASE_SLACK = 30.0
LEASE_RECHECK = 5.0
SETTLED_MEMORY = 100_000


@dataclass
class Plan:
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


def give_way(deadline: float) -> bool:
    """Before a store or ledger call: let a starting turn register, then wait for no turn
    in flight until `deadline`. True when no turn runs."""
    time.sleep(YIELD)
    return TURNS.wait_for_idle(max(0.0, deadline - time.monotonic()))


def by_ledger(jobs: list[ExtractionJob]) -> dict[ExtractionLedger, list[ExtractionJob]]:
    grouped: dict[ExtractionLedger, list[ExtractionJob]] = {}
    for job in jobs:
        grouped.setdefault(job.ledger, []).append(job)
    return grouped


class Pipeline:
    """Holds each key once: queued, claimed, extracting or waiting to be written."""

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

    def settle(self, key: str) -> None:
        """Note `key` as done or lost in this process (no longer in hand)."""
        with self._cond:
            self._active.pop(key, None)
            self._settled[key] = None
            while len(self._settled) > SETTLED_MEMORY:
                self._settled.popitem(last=False)
            self._cond.notify_all()

    def _start(self) -> None:
        if self._writer is None:
            self._pool = ThreadPoolExecutor(EXTRACT_WORKERS, thread_name_prefix="cyrene-extract")
            self._writer = threading.Thread(
                target=self._run, name="cyrene-memory-writer", daemon=True
            )
            self._writer.start()

    # -- the writer thread ---------------------------------------------------
    def _run(self) -> None:
        last = 0.0
        while True:
            with self._cond:
                oldest, wake = self._due()
                while oldest is None:
                    self._cond.wait(wake)
                    oldest, wake = self._due()
            time.sleep(max(0.0, last + MIN_GAP - time.monotonic()))
            try:
                self._cycle(deadline=max(oldest, last) + MAX_DEFER)
            except Exception:  # a bug here must not stop every later extraction
                log.exception("memory writer cycle failed")
            last = time.monotonic()

    def _due(self) -> tuple[float | None, float | None]:
        """(When the longest-waiting due work became due, seconds until the next retry is due)."""
        now = time.monotonic()
        due = [j.waiting_since for j in (*self._ready, *self._failed)]
        due += [max(j.waiting_since, j.not_before) for j in self._inbox if j.not_before <= now]
        later = [j.not_before - now for j in self._inbox if j.not_before > now]
        return (min(due) if due else None), (min(later) if later else None)

    def _cycle(self, deadline: float) -> None:
        now = time.monotonic()
        with self._cond:
            ready, self._ready = self._ready, []
            failed, self._failed = self._failed, []
            fresh = [j for j in self._inbox if j.not_before <= now][:CLAIM_BATCH]
            for job in fresh:
                self._inbox.remove(job)
        stored, broken = self._store(ready, deadline)
        plan = self._decide(fresh, deadline)
        failed += broken + plan.unreadable
        lost = plan.lost + [j for j in failed if j.attempts >= MAX_ATTEMPTS]
        written = self._record(stored, plan.claims, lost, deadline)
        for job in stored:
            if job in written:
                job.count("succeeded")
                job.count("stored", len(job.items))
                self.settle(job.key)
            else:
                self._fail(job)
        for job in plan.skipped:
            job.count("skipped")
            self.settle(job.key)
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
                self._fail(job)

    def _store(
        self, ready: list[ExtractionJob], deadline: float
    ) -> tuple[list[ExtractionJob], list[ExtractionJob]]:
        """Write the ready jobs' items in chunks; (jobs fully stored, jobs whose write failed)."""
        pairs = [(job, item) for job in ready for item in job.items]
        broken: set[ExtractionJob] = set()
        start = 0
        while start < len(pairs):
            chunk = pairs[start : start + (QUIET_CHUNK if give_way(deadline) else BUSY_CHUNK)]
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

    def _decide(self, fresh: list[ExtractionJob], deadline: float) -> Plan:
        """Read the ledger for new jobs and sort them (see `Plan`)."""
        plan = Plan()
        for ledger, jobs in by_ledger(fresh).items():
            give_way(deadline)
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
        deadline: float,
    ) -> set[ExtractionJob]:
        """One ledger write per ledger: done, claimed and lost records; the jobs it covered."""
        owner, wall = this_owner(), time.time()
        claimed, done = set(claims), set(stored)
        written: set[ExtractionJob] = set()
        for ledger, jobs in by_ledger([*stored, *claims, *lost]).items():
            records: dict[str, Record] = {}
            for job in jobs:
                if job in claimed:
                    until = wall + job.timeout + LEASE_SLACK
                    records[job.key] = Record("running", job.attempts, owner, until)
                else:
                    records[job.key] = Record("done" if job in done else "lost", job.attempts)
            give_way(deadline)
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
    def _fail(self, job: ExtractionJob) -> None:
        """A job whose ledger write failed: a failed attempt, retried or lost next cycle."""
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
        self.settle(job.key)
