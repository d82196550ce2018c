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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
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
                self._idle.notify_all()

    def wait_for_idle(self, timeout: float) -> bool:
        """Block until no turn runs or `timeout` passes; True when idle."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout=timeout)


TURNS = TurnActivity()


def wait_for_extractions(timeout: float | None = None) -> bool:
    """Drain every graph's pending background extraction; True when all finished in time."""
    return all([jobs.wait(timeout) for jobs in list(_LIVE)])


class BackgroundJobs:
    """A single-worker queue of extraction jobs with per-job deadlines.

    Writers pace themselves with `wait_for_idle()`: an embedded Chroma write
    holds the interpreter for its whole duration (~0.4 ms per item here), so
    background writes go in small batches, each only while no turn is in
    flight (`TURNS`, marked by the graph) or once `max_defer` seconds have
    passed — a reply is never stalled by more than one small batch.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, max_defer: float = 5.0) -> None:
        _LIVE.add(self)
        self.timeout = timeout
        self.max_defer = max_defer
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

    def wait_for_idle(self) -> None:
        """Block (a background writer) until no turn runs, or `max_defer` passes."""
        TURNS.wait_for_idle(self.max_defer)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until pending jobs finish (or `timeout` passes); True when none is left."""
        with self._lock:
            pending = set(self._pending)
        _, not_done = wait_futures(pending, timeout=timeout)
        return not not_done
