"""The process-wide extraction pipeline: one queue, an extractor pool, one writer thread.

    submit ─▶ claim (ledger swap) ─▶ extract (pool, deadline) ─▶ record plan, apply ─▶ mark done

A session's jobs go through it in turn order: those due together are planned one
after another on one pool thread, each against the store and what the earlier ones
plan to change, and applied in that order (`nodes.extraction.cycle.store_items`); one in hand
elsewhere holds back the later ones until it is stored, in this process and in any
other (a session's next turn hands this pipeline every earlier job its checkpoint
still lists, so one still running elsewhere holds the later ones here until the
ledger calls it done). Sessions run side by side.

The writer works in cycles. A cycle takes everything that waited: it reads the
ledger for the jobs that came in, claims them in one compare-and-swap per
ledger and starts their extraction; while they extract it gives way to turns,
then writes what is extracted (these jobs' and earlier ones') and marks done or
lost in one write per ledger. A job whose extractor is quick is therefore
claimed, extracted and stored in one cycle (`python -m tests.bench.extraction`:
a p95 lag of ~1 s under load; 2.5 s when claiming and storing took two cycles).
The steps, and what a failure in each costs a job, are in `nodes.extraction.cycle`.

Writes give way to turns (an embedded Chroma call holds the interpreter), but
never for longer than `MAX_DEFER` after the oldest waiting work arrived, and
after the previous cycle: under steady traffic a cycle therefore comes every
`MAX_DEFER` with everything that waited, instead of starving. Cycles are at
least `MIN_GAP` apart, so turn-by-turn work is batched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from memory.lifecycle.operations import Change, planned
from nodes.extraction.cycle import (
    MAX_ATTEMPTS,
    MAX_BACKOFF,
    RETRY_DELAYS,
    behind_held,
    chains,
    claim,
    decide,
    mark,
    store_items,
)
from nodes.extraction.jobs import ExtractionJob, JobId, run_with_deadline

log = logging.getLogger("cyrene.memory")

QUEUE_CAPACITY = 512
SUBMIT_WAIT = 1.0
MAX_DEFER = 0.4
MIN_GAP = 0.2
CLAIM_BATCH = 256
EXTRACT_WORKERS = 8
SETTLED_MEMORY = 100_000


class Pipeline:
    """Holds each job once (by `ExtractionJob.ident`: its store's and its key): queued,
    claimed, extracting or waiting to be written."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inbox: deque[ExtractionJob] = deque()
        self._ready: list[ExtractionJob] = []
        self._active: dict[JobId, ExtractionJob] = {}
        self._extracting: set[JobId] = set()
        self._settled: OrderedDict[JobId, None] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._writer: threading.Thread | None = None

    # -- what callers see ----------------------------------------------------
    def depth(self) -> int:
        with self._cond:
            return len(self._active)

    def known(self, ident: JobId) -> bool:
        with self._cond:
            return ident in self._active or ident in self._settled

    def settled(self, ident: JobId) -> bool:
        with self._cond:
            return ident in self._settled

    def submit(self, job: ExtractionJob, backlog: bool = False) -> bool:
        """Queue a job (a key already in hand is a no-op); False when the queue stayed full.

        A `backlog` job (recovery at start) is taken even over capacity: the
        backlog is finite, and it must not wait behind itself.
        """
        with self._cond:
            if job.ident in self._active or job.ident in self._settled:
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
            self._active[job.ident] = job
            self._inbox.append(job)
            job.count("submitted")
            self._start()
            self._cond.notify_all()
        return True

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._active, timeout=timeout)

    def settle(self, ident: JobId) -> None:
        """Note the job as done or lost in this process (no longer in hand)."""
        with self._cond:
            self._active.pop(ident, None)
            self._settled[ident] = None
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
        """(When the longest-waiting due work became due, seconds until the next retry is due);
        a job behind an earlier one of its session is not due (its settling wakes the writer)."""
        now = time.monotonic()
        due = [j.waiting_since for j in self._ready]
        ripe = [j for j in self._inbox if j.not_before <= now]
        due += [max(j.waiting_since, j.not_before) for j in self._unblocked(ripe)]
        later = [j.not_before - now for j in self._inbox if j.not_before > now]
        return (min(due) if due else None), (min(later) if later else None)

    def _cycle(self, deadline: float) -> None:
        now = time.monotonic()
        with self._cond:
            due = [j for j in self._inbox if j.not_before <= now]
            fresh = self._unblocked(due)[:CLAIM_BATCH]
            for job in fresh:
                self._inbox.remove(job)
        # The ledger steps do not wait for turns (a SQLite file or a server: neither holds
        # the interpreter), so the new jobs extract while the cycle gives way before writing.
        plan = decide(fresh, now)
        claimed, beaten, unclaimed = claim(plan.claims, now)
        if fresh and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "cycle: claimed %s; beaten %s; later %s; skipped %s",
                _keys(claimed),
                _keys(beaten),
                _keys(job for job, _ in plan.later),
                _keys(plan.skipped),
            )
        held = [*(job for job, _ in plan.later), *plan.unreadable, *beaten, *unclaimed]
        going, waiting = behind_held([*claimed, *plan.stores], held)
        for chain in chains(going):
            if all(job.changes is not None for job in chain):
                for job in chain:  # planned under an earlier claim that lapsed: store them
                    self._make_ready(job)
            else:
                self._extract(chain)
        for job in waiting:
            self._requeue(job, now)  # an earlier job of its session is held: after it
        with self._cond:
            self._cond.wait_for(lambda: not self._extracting, max(0.0, deadline - now))
            ready, self._ready = self._ready, []
        stored, unstored = store_items(ready, deadline)
        marked = mark(stored, plan.lost, deadline)
        for job in stored:
            if job in marked:
                job.count("succeeded")
                job.count("stored", len(job.changes or []))
                self.settle(job.ident)
        for job in plan.lost:
            if job in marked:
                self._lose(job)
        unmarked = [j for j in (*stored, *plan.lost) if j not in marked]
        if marked and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "cycle: done %s; lost %s",
                _keys(j for j in marked if j not in plan.lost),
                _keys(j for j in marked if j in plan.lost),
            )
        for job in (*unstored, *plan.unreadable, *unclaimed, *unmarked):
            self._set_back(job)
        for job in plan.skipped:
            job.count("skipped")
            self.settle(job.ident)
        for job, when in plan.later:
            self._requeue(job, when)
        for job in beaten:
            self._requeue(job, now)  # claimed elsewhere first: see by whom next cycle

    def _unblocked(self, due: list[ExtractionJob]) -> list[ExtractionJob]:
        """The due jobs no earlier job of their session holds back: one that is in hand
        here and not due with them (extracting, waiting for its store, held elsewhere).
        A session's due jobs go together, as one chain (`chains`)."""
        taken = set(due)
        earliest: dict[tuple[int, str], int] = {}
        for other in self._active.values():
            if other.lane is not None and other not in taken:
                earliest[other.lane] = min(earliest.get(other.lane, other.order), other.order)
        return [
            job for job in due if job.lane is None or job.order <= earliest.get(job.lane, job.order)
        ]

    def _extract(self, chain: list[ExtractionJob]) -> None:
        assert self._pool is not None
        with self._cond:
            self._extracting.update(job.ident for job in chain)
        self._pool.submit(self._attempt, chain)

    # -- one session's chain of attempts (on a pool thread) --------------------
    def _attempt(self, chain: list[ExtractionJob]) -> None:
        """Plan a session's jobs one after another, each against what the earlier ones
        plan to change (they are applied in this order: `nodes.extraction.cycle.store_items`); one
        that fails holds back those after it."""
        earlier: list[Change] = []
        try:
            for n, job in enumerate(chain):
                if job.changes is None and not self._run_attempt(job, earlier):
                    for later in chain[n + 1 :]:
                        self._requeue(later, time.monotonic())
                    return
                earlier += job.changes or []
                self._make_ready(job)
        finally:
            with self._cond:
                self._extracting.difference_update(job.ident for job in chain)
                self._cond.notify_all()

    def _run_attempt(self, job: ExtractionJob, earlier: list[Change]) -> bool:
        """Extract and plan `job` (given what its session's earlier jobs change); whether it
        has changes now (else it is requeued for a retry or to be marked lost)."""
        job.tried = True
        outcome = run_with_deadline(partial(job.extract, earlier=earlier), job.timeout)
        if isinstance(outcome, list):
            source = job.source.model_copy(update={"extraction": job.key})
            try:
                job.changes = planned(outcome, persona_id=job.persona_id, source=source)
            except Exception as exc:  # the extractor returned something that is no operation
                outcome = exc
            else:
                return True
        if outcome is None:
            job.count("timed_out")
            log.warning(
                "memory extraction %s overran %.1fs; its items are discarded", job.key, job.timeout
            )
        else:
            job.count("failed")
            log.error("background memory extraction failed", exc_info=outcome)
        if job.attempts < MAX_ATTEMPTS:
            job.count("retried")
            self._requeue(job, time.monotonic() + RETRY_DELAYS[job.attempts - 1])
        else:  # the ledger shows its last claim: the next cycle marks it lost
            self._requeue(job, time.monotonic())
        return False

    # -- settling --------------------------------------------------------------
    def _make_ready(self, job: ExtractionJob) -> None:
        with self._cond:
            job.waiting_since = time.monotonic()
            self._ready.append(job)
            self._cond.notify_all()

    def _set_back(self, job: ExtractionJob) -> None:
        """The store or the ledger failed this job's call: try again after a growing backoff."""
        job.setbacks += 1
        job.count("setbacks")
        delay = min(MAX_BACKOFF, RETRY_DELAYS[0] * 2 ** (job.setbacks - 1))
        self._requeue(job, time.monotonic() + delay)

    def _requeue(self, job: ExtractionJob, when: float) -> None:
        with self._cond:
            job.not_before = when
            self._inbox.append(job)
            self._cond.notify_all()

    def _lose(self, job: ExtractionJob) -> None:
        """A job the ledger now records as lost: said once, at error level, and counted."""
        job.count("lost")
        log.error(
            "memory extraction %s (session %s, message %s) %s; its memories are lost",
            job.key,
            job.source.session_id,
            job.source.message_id,
            job.abandon,
        )
        self.settle(job.ident)


def _keys(jobs: Iterable[ExtractionJob]) -> str:
    """Jobs for a debug line: each key's start and the message its turn answered."""
    return " ".join(f"{j.key[:8]}({j.source.message_id})" for j in jobs) or "-"
