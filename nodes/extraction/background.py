"""Background extraction: off the reply path, durable, bounded, and quick to land.

Every turn's background extraction becomes an `ExtractionJob`, keyed by the
turn; the graph records the key in the session's checkpoint before the turn
returns, so a crash never loses it (`nodes.extraction.node`). One process-wide
pipeline (`nodes.extraction.pipeline`) runs the jobs of every graph, each store's
keys apart from every other's (`nodes.extraction.jobs.job_id`):

- **Exactly once in effect.** A job is claimed in the store's ledger
  (`nodes.extraction.ledger`) with a compare-and-swap before its extractor
  runs, so of several processes recovering it one runs it; it is marked done
  right after its items are written, and a key the ledger calls done (or
  lost) is never run again. Its items have ids from the job's key and their
  position, so when a crash fell between writing them and marking them done,
  the re-run rewrites them, whatever its words, and deletes what it did not
  write again.
- **Bounded retries, honest losses.** A failed or overrun attempt is retried
  after a short backoff, up to three claims in all (a crash mid-attempt counts
  too); then the job is marked lost, and only then logged at error level and
  counted. A store or ledger that cannot be reached is no attempt: the work
  waits, with backoff, and is never called lost.
- **Keeps up without slowing turns.** Writes are batched into cycles that
  give way to turns in flight (`TURNS`), but never for longer than a short
  bound, so under steady traffic memories land within about a second.
- **Bounded and observable.** A full queue makes `submit` wait briefly, then
  leaves the job pending in its checkpoint for the session's next run
  (counted as `deferred`). `queue_depth()` and `extraction_stats()` show it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

from langchain_core.messages.ai import UsageMetadata

from nodes.extraction.jobs import DEFAULT_TIMEOUT, TOTALS, TURNS, ExtractionJob, JobStats, job_id
from nodes.extraction.ledger import extraction_ledger_for
from nodes.extraction.pipeline import Pipeline
from nodes.token_accounting.aside import measured
from nodes.token_accounting.usage import summed

__all__ = [
    "SPENT",
    "TURNS",
    "BackgroundJobs",
    "ExtractionJob",
    "JobStats",
    "extraction_stats",
    "queue_depth",
    "unfinished",
    "wait_for_extractions",
]


class SpentTokens:
    """The tokens background extractions spent, per memory store and session, until that
    session's next `extract_memory` takes them into its state (`token_usage`, purpose
    `extraction`). Keyed by the store too: two graphs of one process may use one thread id
    over two stores. What a process spent and did not hand on before it stopped is not
    counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent: weakref.WeakKeyDictionary[Any, dict[str | None, UsageMetadata]] = (
            weakref.WeakKeyDictionary()
        )

    def counting(
        self, store: Any, session: str | None, extract: Callable[..., Any]
    ) -> Callable[..., Any]:
        """`extract`, its model calls' tokens put down to `session` of `store`."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            result, usage = measured(lambda: extract(*args, **kwargs))
            if usage is not None:
                with self._lock, suppress(TypeError):  # a backend no weak reference can hold
                    spent = self._spent.setdefault(store, {})
                    spent[session] = summed(spent.get(session), usage)
            return result

        return counted

    def take(self, store: Any, session: str | None) -> UsageMetadata | None:
        """What `session`'s extractions into `store` spent since the last take."""
        with self._lock:
            return self._spent.get(store, {}).pop(session, None)


_PIPELINE = Pipeline()
SPENT = SpentTokens()


def _forked() -> None:
    """A forked child has none of the parent's threads: it starts a pipeline of its own."""
    global _PIPELINE, SPENT
    _PIPELINE = Pipeline()
    SPENT = SpentTokens()


os.register_at_fork(after_in_child=_forked)


class BackgroundJobs:
    """One graph's handle on the process-wide pipeline: its deadline and its counts."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self.stats = JobStats()

    def submit(self, job: ExtractionJob, backlog: bool = False) -> bool:
        """Queue `job` under this graph's deadline and counts; False when it stays pending.

        A `backlog` job (recovery at start) is taken even when the queue is full.
        """
        job.timeout, job.stats = self.timeout, self.stats
        return _PIPELINE.submit(job, backlog)

    @staticmethod
    def known(store: Any, key: str) -> bool:
        """Whether this process has the extraction into `store` in hand or has settled it."""
        return _PIPELINE.known(job_id(store, key))

    @staticmethod
    def settled(store: Any, key: str) -> bool:
        """Whether this process saw the extraction into `store` done or lost (it need not
        stay pending)."""
        return _PIPELINE.settled(job_id(store, key))


def unfinished(store: Any, keys: list[str]) -> set[str]:
    """Those of `keys` that the store's ledger does not call done or lost."""
    records = extraction_ledger_for(store).read(keys) if keys else {}
    return {k for k in keys if k not in records or records[k].state == "running"}


def queue_depth() -> int:
    """Extractions in this process not yet settled (queued, running, or waiting to be written)."""
    return _PIPELINE.depth()


def extraction_stats() -> JobStats:
    """A snapshot of every graph's extraction counts in this process, with the queue depth."""
    return replace(TOTALS, queued=queue_depth())


def wait_for_extractions(timeout: float | None = None) -> bool:
    """Drain this process's background extraction; True when everything settled in time."""
    return _PIPELINE.wait(timeout)
