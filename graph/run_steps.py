"""A run of `CyreneGraph` as steps: one generator of steps, a sync and an async driver.

`CyreneGraph._steps` is written once; `stream` carries its steps out in the
caller's thread and `astream` awaits them. Each step is an `Ask` (a read of the
saver or a lock operation, with a sync and an async form), a `Run` (the turn:
LangGraph's stream, whose chunks go to the caller) or an `Emit` (chunks another
caller's turn produced). The `Stepper` feeds each step's value or exception back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from langchain_core.runnables import RunnableConfig


@dataclass
class Ask:
    """A read of the saver or state, or a lock operation: `get` from a sync run,
    `aget` from an async one; the step generator is sent what it returns."""

    get: Callable[..., Any]
    aget: Callable[..., Awaitable[Any]]
    args: tuple = ()


@dataclass
class Run:
    """The turn itself: LangGraph's stream, counted in `TURNS`; its chunks go to the caller.
    A `quiet` run is not the caller's (a dead turn finished first): its chunks are dropped,
    and its failure is logged, not raised."""

    input: Any
    config: RunnableConfig | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    quiet: bool = False


@dataclass
class Emit:
    """Chunks for the caller that no turn of its own produced (another caller's turn
    answered it)."""

    chunks: list[Any]


Step = Ask | Run | Emit
Steps = Generator[Step, Any, Any]


class Stepper:
    """Feeds a run's steps what each step came to: its value, or the exception it raised
    (so the steps' `finally` still gives the session back when the caller stops early)."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self._resume: Callable[[], Step] = partial(steps.send, None)

    def next(self) -> Step | None:
        """The next step; None once the run is over (its exception, if any, is raised)."""
        try:
            return self._resume()
        except StopIteration:
            return None

    def answer(self, value: Any) -> None:
        self._resume = partial(self._steps.send, value)

    def fail(self, exc: BaseException) -> None:
        self._resume = partial(self._steps.throw, exc)
