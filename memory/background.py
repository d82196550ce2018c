"""Background extraction: off the reply path, bounded in time, observable.

Jobs run on one daemon worker thread, in order. Each gets a snapshot of the
conversation and a deadline (60 s by default); a job that fails or overruns is
logged and counted, never raised into a turn, and an overrun job's items are
discarded when it finally returns. `wait()` lets tests, the CLI and shutdown
drain pending work.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

log = logging.getLogger("cyrene.memory")

DEFAULT_TIMEOUT = 60.0


@dataclass
class JobStats:
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    stored: int = 0


_LIVE: weakref.WeakSet[BackgroundJobs] = weakref.WeakSet()


def wait_for_extractions(timeout: float | None = None) -> bool:
    """Drain every graph's pending background extraction; True when all finished in time."""
    return all([jobs.wait(timeout) for jobs in list(_LIVE)])


class BackgroundJobs:
    """A single-worker queue of extraction jobs with per-job deadlines."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        _LIVE.add(self)
        self.timeout = timeout
        self.stats = JobStats()
        self._lock = threading.Lock()
        self._pending: set[Future] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cyrene-extract")

    def submit(self, extract: Callable[[], list], persist: Callable[[list], int]) -> Future:
        """Run `extract()` in the background, then `persist(items)` if it beat the deadline."""
        with self._lock:
            self.stats.submitted += 1
        future = self._executor.submit(self._run, extract, persist)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return future

    def _run(self, extract: Callable[[], list], persist: Callable[[list], int]) -> None:
        # The extractor runs on its own daemon thread so a hung model call
        # cannot hold the queue past its deadline; its late result is dropped.
        outcome: dict[str, object] = {}

        def target() -> None:
            try:
                outcome["items"] = extract()
            except Exception as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=target, name="cyrene-extract-job", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            self._count("timed_out")
            log.warning("memory extraction overran %.1fs; its items are discarded", self.timeout)
            return
        try:
            if "error" in outcome:
                raise outcome["error"]  # type: ignore[misc]
            stored = persist(outcome["items"])  # type: ignore[arg-type]
        except Exception:
            self._count("failed")
            log.exception("background memory extraction failed")
            return
        with self._lock:
            self.stats.succeeded += 1
            self.stats.stored += stored

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until pending jobs finish (or `timeout` passes); True when none is left."""
        with self._lock:
            pending = set(self._pending)
        _, not_done = wait_futures(pending, timeout=timeout)
        return not not_done
