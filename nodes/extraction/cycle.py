"""One writer cycle's steps (`nodes.extraction.pipeline`), each a plain function over jobs.

    decide (read the ledger and plans) ─▶ store_items (record plans, apply) ─▶ claim
    (compare-and-swap) ─▶ mark (done, lost)

A job's changes (`memory.lifecycle.operations.Change`) are recorded as its plan in the
ledger before any is applied (`nodes.extraction.plans`), and a job that finds a plan
there applies it instead of running its extractor: a replay after a crash
re-applies the same supersedes and forgets, which the store applies
idempotently, instead of asking the model about handles that now name other
memories.

What can go wrong, and what it costs a job:
- its extractor raises or overruns: a failed attempt, retried after a short
  backoff; after `MAX_ATTEMPTS` claims (crashed runs count) it is marked lost;
- the store or the ledger cannot be reached (a Chroma server down): a setback,
  not an attempt. The job keeps its place, and its extracted items (so its
  extractor does not run again), and is tried again after a backoff that
  grows to `MAX_BACKOFF`, for as long as the process runs; it is still pending
  in its checkpoint, so a restart takes it up too. It is never called lost;
- another process wins the claim: the job is looked at again, and left to the
  winner while its lease holds.
A job is reported lost (logged at error level, counted) only once the ledger
records it so: from then on nothing runs it again.

An embedded Chroma call holds the interpreter for its whole run (here about
5 ms a call plus 0.35 ms an item), so every step gives way to turns: before
each store or ledger call it sleeps `YIELD` (a turn that is starting gets to
register in `TURNS`) and then waits for no turn in flight, but only until the
deadline it is given: the cycle's for the writes, now for the reads and claims
that start a cycle (`nodes.extraction.pipeline`), so that new jobs extract meanwhile.
Items go in chunks of `QUIET_CHUNK` while no turn runs (a turn that starts
waits for one small chunk at most) and of `BUSY_CHUNK` once forced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from memory.lifecycle.operations import Change
from memory.protocols import PrunesExtractions
from nodes.extraction.jobs import TURNS, ExtractionJob
from nodes.extraction.ledger import Record, claimable, same_claim, this_owner
from nodes.extraction.planning import apply_changes
from nodes.extraction.plans import decode, encode, plan_book

log = logging.getLogger("cyrene.memory")

MAX_ATTEMPTS = 3
RETRY_DELAYS = (0.5, 2.0)  # before the 2nd and the 3rd attempt
MAX_BACKOFF = 30.0  # between tries of a store or ledger that is down
YIELD = 0.002
QUIET_CHUNK = 8
BUSY_CHUNK = 64
LEASE_SLACK = 30.0
LEASE_RECHECK = 5.0

T = TypeVar("T")
K = TypeVar("K")
_UNPRUNED: set[type] = set()
_UNPLANNED: set[type] = set()


@dataclass
class Plan:
    """What the ledger says about a cycle's new jobs."""

    claims: list[tuple[ExtractionJob, Record | None]] = field(default_factory=list)
    """Nobody holds them: claim (in place of the record read) and run."""
    stores: list[ExtractionJob] = field(default_factory=list)
    """Extracted under a claim that is still theirs, their write not yet done: store again."""
    skipped: list[ExtractionJob] = field(default_factory=list)
    """Already done or lost."""
    lost: list[ExtractionJob] = field(default_factory=list)
    """Claimed `MAX_ATTEMPTS` times already, or unable to run: mark them lost."""
    later: list[tuple[ExtractionJob, float]] = field(default_factory=list)
    """Held by a live claim elsewhere: look again at the given time."""
    unreadable: list[ExtractionJob] = field(default_factory=list)
    """The ledger could not be read: a setback."""


def give_way(deadline: float) -> bool:
    """Before a store or ledger call: let a starting turn register, then wait for no turn
    in flight until `deadline`. True when no turn runs."""
    time.sleep(YIELD)
    return TURNS.wait_for_idle(max(0.0, deadline - time.monotonic()))


def group(values: Iterable[T], by: Callable[[T], K]) -> dict[K, list[T]]:
    """`values` by `by(value)`, in order (one store or ledger call per group)."""
    grouped: dict[K, list[T]] = {}
    for value in values:
        grouped.setdefault(by(value), []).append(value)
    return grouped


def sort_job(plan: Plan, job: ExtractionJob, record: Record | None, wall: float) -> None:
    """Put a job where its ledger record sends it (see `Plan`)."""
    if record is not None and record.state != "running":
        plan.skipped.append(job)
    elif job.changes is not None and job.claim is not None and same_claim(record, job.claim):
        plan.stores.append(job)
    elif held_back(job, record):
        plan.claims.append((job, record))
    elif not claimable(record, wall):
        assert record is not None
        wait = min(max(record.until - wall, 0.0), LEASE_RECHECK)
        plan.later.append((job, time.monotonic() + wait))
    elif job.abandon or (record is not None and record.attempts >= MAX_ATTEMPTS):
        job.attempts = record.attempts if record is not None else job.attempts
        job.abandon = job.abandon or f"failed {job.attempts} times"
        plan.lost.append(job)
    else:
        plan.claims.append((job, record))


def chains(jobs: Iterable[ExtractionJob]) -> list[list[ExtractionJob]]:
    """The jobs as chains: each session's in turn order (a job of no session alone)."""
    by_session = group(sorted(jobs, key=lambda j: j.order), lambda j: j.lane or id(j))
    return list(by_session.values())


def behind_held(
    jobs: list[ExtractionJob], held: list[ExtractionJob]
) -> tuple[list[ExtractionJob], list[ExtractionJob]]:
    """(jobs that may go on, jobs that wait): one waits while an earlier job of its session
    is held (claimed elsewhere, its ledger unreadable)."""
    first: dict[tuple[int, str], int] = {}
    for job in held:
        if job.lane is not None:
            first[job.lane] = min(first.get(job.lane, job.order), job.order)
    waits = [j for j in jobs if j.lane is not None and j.order > first.get(j.lane, j.order)]
    return [j for j in jobs if j not in waits], waits


def prune_earlier_runs(jobs: list[ExtractionJob]) -> None:
    """Jobs of one store that were claimed before: delete what an earlier run stored that
    this run did not write again (a model may find fewer items the second time)."""
    store = jobs[0].store
    if isinstance(store, PrunesExtractions):
        store.prune_extractions({j.key: written_ids(j) for j in jobs})
    elif type(store) not in _UNPRUNED:
        _UNPRUNED.add(type(store))
        log.warning(
            "memory backend %s has no prune_extractions(): an extraction run again after a "
            "crash may leave items of its earlier run beside the new ones",
            type(store).__name__,
        )


def written_ids(job: ExtractionJob) -> set[str]:
    """The ids of the memories a job's changes write."""
    return {str(c.item.id) for c in job.changes or [] if c.item is not None}


def adopt_plans(jobs: list[ExtractionJob]) -> None:
    """Give jobs that have no changes yet the plan their ledger recorded, if any: a replay
    applies it (even when its turn is gone from the transcript) and extracts nothing."""
    book = plan_book(jobs[0].ledger)
    if book is None:
        return
    plans = book.read([j.key for j in jobs if j.changes is None])
    for job in jobs:
        if job.key in plans:
            job.changes, job.planned, job.abandon = decode(plans[job.key]), True, ""


def record_plans(jobs: list[ExtractionJob], deadline: float) -> set[ExtractionJob]:
    """Record each unplanned job's changes as its plan, adopting a plan recorded first;
    the jobs whose ledger could not be written."""
    broken: set[ExtractionJob] = set()
    for same in group([j for j in jobs if not j.planned], lambda j: j.ledger).values():
        book = plan_book(same[0].ledger)
        if book is None:
            if type(same[0].ledger) not in _UNPLANNED:
                _UNPLANNED.add(type(same[0].ledger))
                log.warning(
                    "extraction ledger %s keeps no plans(): a replay after a crash asks the "
                    "extractor again instead of re-applying what it decided",
                    type(same[0].ledger).__name__,
                )
            continue
        give_way(deadline)
        try:
            kept = book.record({j.key: encode(j.changes or []) for j in same})
        except Exception as exc:
            setback("recording extraction plans", exc, same)
            broken.update(same)
            continue
        for job in same:
            job.changes, job.planned = decode(kept[job.key]), True
    return broken


def setback(what: str, exc: BaseException, jobs: list[ExtractionJob]) -> None:
    log.warning(
        "%s failed (%s: %s): %d extraction(s) keep their place and are tried again; none is lost",
        what,
        type(exc).__name__,
        exc,
        len(jobs),
    )


def decide(fresh: list[ExtractionJob], deadline: float) -> Plan:
    """Read the ledger for new jobs and sort them (see `Plan`)."""
    plan = Plan()
    for jobs in group(fresh, lambda j: j.ledger).values():
        give_way(deadline)
        try:
            records = jobs[0].ledger.read([j.key for j in jobs])
            adopt_plans(jobs)
        except Exception as exc:
            setback("reading the extraction ledger", exc, jobs)
            plan.unreadable += jobs
            continue
        wall = time.time()
        for job in jobs:
            sort_job(plan, job, records.get(job.key), wall)
    return plan


def store_items(
    jobs: list[ExtractionJob], deadline: float
) -> tuple[list[ExtractionJob], list[ExtractionJob]]:
    """Record the jobs' plans, apply their changes in chunks, then clear what earlier runs
    of re-run jobs left; (jobs fully applied, jobs whose store or ledger could not be written)."""
    broken = record_plans(jobs, deadline)
    pairs = [(job, change) for job in jobs if job not in broken for change in job.changes or []]
    start = 0
    while start < len(pairs):
        end = chunk_end(pairs, start, QUIET_CHUNK if give_way(deadline) else BUSY_CHUNK)
        chunk, start = pairs[start:end], end
        for same in group(chunk, lambda pair: id(pair[0].store)).values():
            try:
                apply_changes(same[0][0].store, [change for _, change in same])
            except Exception as exc:
                setback("a background memory write", exc, [job for job, _ in same])
                broken.update(job for job, _ in same)
    reruns = [j for j in jobs if j.attempts > 1 and j not in broken]
    for same_store in group(reruns, lambda j: id(j.store)).values():
        give_way(deadline)
        try:
            prune_earlier_runs(same_store)
        except Exception as exc:
            setback("clearing an earlier run's memories", exc, same_store)
            broken.update(same_store)
    return [j for j in jobs if j not in broken], [j for j in jobs if j in broken]


def chunk_end(pairs: list[tuple[ExtractionJob, Change]], start: int, size: int) -> int:
    """Where a chunk of `size` changes from `start` ends, but never inside a job that
    supersedes or forgets: the store's write-time duplicate check keeps a new fact that
    near-duplicates a memory the same write takes (`memory.lifecycle.changes`)."""
    end = min(start + size, len(pairs))
    job = pairs[end - 1][0]
    if any(change.replaced for change in job.changes or []):
        while end < len(pairs) and pairs[end][0] is job:
            end += 1
    return end


def claim(
    claims: list[tuple[ExtractionJob, Record | None]], deadline: float
) -> tuple[list[ExtractionJob], list[ExtractionJob], list[ExtractionJob]]:
    """One compare-and-swap per ledger: (jobs claimed, jobs another process claimed
    first, jobs whose ledger could not be written)."""
    owner, wall = this_owner(), time.time()
    won: list[ExtractionJob] = []
    beaten: list[ExtractionJob] = []
    failed: list[ExtractionJob] = []
    for pairs in group(claims, lambda pair: pair[0].ledger).values():
        jobs = [job for job, _ in pairs]
        swaps = {
            job.key: (
                record,
                Record(
                    "running",
                    _attempts(job, record),
                    owner,
                    wall + job.timeout + LEASE_SLACK,
                ),
            )
            for job, record in pairs
        }
        give_way(deadline)
        try:
            written = jobs[0].ledger.swap(swaps)
        except Exception as exc:
            setback("claiming in the extraction ledger", exc, jobs)
            failed += jobs
            continue
        for job in jobs:
            if job.key in written:
                job.claim = swaps[job.key][1]
                job.attempts, job.tried = job.claim.attempts, False
                won.append(job)
            else:
                beaten.append(job)
    return won, beaten, failed


def held_back(job: ExtractionJob, record: Record | None) -> bool:
    """Whether `record` is this process's claim on a job that was held back behind an
    earlier one of its session and so made no attempt under it."""
    return job.claim is not None and not job.tried and same_claim(record, job.claim)


def _attempts(job: ExtractionJob, record: Record | None) -> int:
    """The attempts a claim makes it: one more, unless it renews a held-back job's claim."""
    if record is None:
        return 1
    return record.attempts if held_back(job, record) else record.attempts + 1


def mark(
    stored: list[ExtractionJob], lost: list[ExtractionJob], deadline: float
) -> set[ExtractionJob]:
    """One ledger write per ledger: done and lost marks; the jobs it covered."""
    done = set(stored)
    marked: set[ExtractionJob] = set()
    for jobs in group([*stored, *lost], lambda j: j.ledger).values():
        records = {j.key: Record("done" if j in done else "lost", j.attempts) for j in jobs}
        give_way(deadline)
        try:
            jobs[0].ledger.write(records)
        except Exception as exc:
            setback("marking extractions in the ledger", exc, jobs)
            continue
        marked.update(jobs)
    return marked
