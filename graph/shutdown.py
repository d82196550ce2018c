"""Graceful stop for a process that runs turns: a signal ends a turn at a step boundary.

A worker process (or the `cyrene` CLI) wraps its work in `GracefulStop()`. SIGTERM
or SIGINT then asks every turn in flight to stop before its next step, through
LangGraph's `RunControl` drain: the step that is running finishes, its checkpoint
is saved (runs default to `durability="sync"`), and the session resumes with
`invoke(None, same thread)` without running a finished tool again. A second
signal acts as if no handler were installed (SIGINT raises `KeyboardInterrupt`,
SIGTERM ends the process), so a hung step never holds a process hostage.

    with GracefulStop() as stop:
        while not stop.requested:
            job = jobs.get()
            if not run_turn(graph, job.input, job.config, stop=stop, context=job.env):
                break  # stopped at a step boundary: the session is resumable
        stop.drain(timeout=60)  # background extraction, bounded once a stop is requested
    sys.exit(stop.exit_code)  # 0, or 128 + the signal (130 SIGINT, 143 SIGTERM)
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained
from langgraph.runtime import RunControl

from nodes.extraction.background import wait_for_extractions

SIGNAL_EXIT_BASE = 128  # the shell's convention: killed by signal N exits 128 + N
DEFAULT_GRACE = 5.0
_POLL = 0.1

Handler = Callable[[int, FrameType | None], Any] | int | None


class StopRequested(BaseException):
    """A stop was requested while no turn was running: raised by the signal handler of
    `GracefulStop(interrupt_idle=True)`, or by a loop that checks between turns.

    A `BaseException`, like `KeyboardInterrupt`, so `except Exception` blocks let it pass.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return SIGNAL_EXIT_BASE + self.signum


class GracefulStop:
    """Turns SIGTERM/SIGINT into a request to stop at the next step boundary.

    Args:
        signals: the signals to handle (installed on `__enter__`, restored on exit;
            like `signal.signal`, only from the main thread).
        interrupt_idle: when a signal arrives while no turn or drain is running,
            raise `StopRequested` at once (an interactive loop waiting for input
            wants that); by default only the flag is set and the worker polls
            `requested` or `wait()`.

    `request()` does the same as a signal, from any thread.
    """

    def __init__(
        self,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        *,
        interrupt_idle: bool = False,
    ) -> None:
        self.signals = tuple(signals)
        self.interrupt_idle = interrupt_idle
        self.signum: int | None = None
        self._requested_at: float | None = None
        self._requested = threading.Event()
        self._signalled = False
        # Reentrant: a signal handler runs on the main thread, possibly while
        # that thread holds the lock in `_working()`.
        self._lock = threading.RLock()
        self._work: set[object] = set()
        """Work a signal must not interrupt: each run's `RunControl`, a token per drain."""
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> GracefulStop:
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    @property
    def requested(self) -> bool:
        """Whether a stop was requested (by a signal or `request()`)."""
        return self._requested.is_set()

    @property
    def exit_code(self) -> int:
        """0, or 128 + the signal that asked to stop (130 for SIGINT, 143 for SIGTERM)."""
        return 0 if self.signum is None else SIGNAL_EXIT_BASE + self.signum

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested or `timeout` passes; True when requested."""
        return self._requested.wait(timeout)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask every turn in flight, and every later one, to stop at its next step boundary."""
        with self._lock:
            if self.signum is None:
                self.signum, self._requested_at = signum, time.monotonic()
            controls = [w for w in self._work if isinstance(w, RunControl)]
        self._requested.set()
        for control in controls:
            self._drain(control)

    def busy(self) -> AbstractContextManager[None]:
        """Mark work that a signal must not interrupt (it asks it to stop instead)."""
        return self._working(object())

    @contextmanager
    def running(self) -> Iterator[RunControl]:
        """A `RunControl` for one run, drained when a stop is (or was already) requested."""
        control = RunControl()
        with self._working(control):
            yield control

    @contextmanager
    def _working(self, work: object) -> Iterator[None]:
        with self._lock:
            self._work.add(work)
            if isinstance(work, RunControl):
                self._drain(work)  # a stop requested before the run began
        try:
            yield
        finally:
            with self._lock:
                self._work.discard(work)

    def drain(self, timeout: float, grace: float = DEFAULT_GRACE) -> bool:
        """Wait for background extraction: up to `timeout` seconds, and at most
        `grace` seconds after a stop was requested. True when nothing is left;
        what is left stays pending for the next start to pick up."""
        with self.busy():
            deadline = time.monotonic() + timeout
            while not wait_for_extractions(_POLL):
                if self._requested_at is not None:
                    deadline = min(deadline, self._requested_at + grace)
                if time.monotonic() >= deadline:
                    return False
            return True

    async def adrain(self, timeout: float, grace: float = DEFAULT_GRACE) -> bool:
        """`drain` off the event loop."""
        return await asyncio.to_thread(self.drain, timeout, grace)

    def _drain(self, control: RunControl) -> None:
        """Ask `control`'s run to stop at its next step boundary, if a stop was requested."""
        if self.signum is not None:
            control.request_drain(signal.Signals(self.signum).name)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._signalled:
            self._force(signum)
            return
        self._signalled = True
        self.request(signum)
        if self.interrupt_idle and not self._work:
            raise StopRequested(signum)

    def _force(self, signum: int) -> None:
        """The second signal: behave as if we had never been installed."""
        self._restore()
        signal.raise_signal(signum)

    def _restore(self) -> None:
        while self._previous:
            signum, previous = self._previous.popitem()
            signal.signal(signum, previous)


def _ignore(chunk: Any) -> None:
    """The default `on_chunk`: the turn's result is in the checkpoint, not the stream."""


@dataclass
class _Turn:
    finished: bool = True
    """False when a stop request ended the turn at a step boundary."""


@contextmanager
def _stoppable(stop: GracefulStop, kwargs: dict[str, Any]) -> Iterator[_Turn]:
    """The frame of one turn, sync or async: `stream_mode` defaults to "updates", and
    the run gets a `RunControl` that a stop request drains (which ends the block)."""
    kwargs.setdefault("stream_mode", "updates")
    turn = _Turn()
    with stop.running() as control:
        kwargs["control"] = control
        try:
            yield turn
        except GraphDrained:
            turn.finished = False


def run_turn(
    graph: Any,
    input: Any,
    config: RunnableConfig,
    *,
    stop: GracefulStop,
    on_chunk: Callable[[Any], None] = _ignore,
    **kwargs: Any,
) -> bool:
    """Run one turn (or resume one, with `input=None`) unless a stop request ends it.

    Args:
        graph: a graph from `build_graph` (with a checkpointer, to be resumable).
        input, config: as for `graph.stream`.
        stop: the process's `GracefulStop`.
        on_chunk: called with every streamed chunk (`stream_mode` defaults to "updates").
        **kwargs: passed to `graph.stream` (`context`, `stream_mode`, `durability`, …).

    Returns:
        True when the turn finished; False when a stop request ended it at a step
        boundary: that step's checkpoint is saved and `invoke(None, config)` finishes it.
    """
    with _stoppable(stop, kwargs) as turn:
        for chunk in graph.stream(input, config, **kwargs):
            on_chunk(chunk)
    return turn.finished


async def arun_turn(
    graph: Any,
    input: Any,
    config: RunnableConfig,
    *,
    stop: GracefulStop,
    on_chunk: Callable[[Any], Awaitable[None] | None] = _ignore,
    **kwargs: Any,
) -> bool:
    """`run_turn` with `astream` (a graph over an async saver). `on_chunk` may also be
    a coroutine function: it is awaited, so a slow consumer slows the stream and never
    loses a chunk."""
    with _stoppable(stop, kwargs) as turn:
        async for chunk in graph.astream(input, config, **kwargs):
            if (pending := on_chunk(chunk)) is not None:
                await pending
    return turn.finished
