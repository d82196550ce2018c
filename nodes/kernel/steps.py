"""Work that may block, and one implementation for the sync and async runs of a node.

An async run hands work that may block (a Chroma search, a user's hook, sink,
guard or `transform_context`) to a worker thread, and runs everything else
right on the event loop. A hop costs two thread switches, a GIL hand-off and a
place in the loop's default executor (min(32, cores + 4) threads: 6 on 2
cores); with dozens of sessions in flight that queue, not the work, sets the
turn rate. So whether work blocks is declared by whoever owns it (a round
policy, a hook) and read once, at build time.

A node whose sync and async twins would differ only in how they wait is
written once, as a generator of steps (`Work`, or any object with `run` and
`arun`), and driven by `drive` or `adrive`; an exception a step raises is
thrown back into the generator at the `yield`, so `try`/`except` around a
step works as in plain code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import run_in_executor

T = TypeVar("T")


async def off_loop(blocks: bool, config: RunnableConfig, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`: on a worker thread when it may block, else here on the event loop."""
    if blocks:
        return await run_in_executor(config, fn, *args)
    return fn(*args)


class Step(Protocol):
    """One thing a step generator waits for: done in place, or awaited in an async run."""

    def run(self) -> Any: ...

    async def arun(self, config: RunnableConfig) -> Any: ...


@dataclass(frozen=True)
class Work:
    """`fn(*args)`, on a worker thread in an async run when it `blocks`."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    blocks: bool = False

    def run(self) -> Any:
        return self.fn(*self.args)

    async def arun(self, config: RunnableConfig) -> Any:
        return await off_loop(self.blocks, config, self.fn, *self.args)


@dataclass(frozen=True)
class Either:
    """`sync()` in a sync run, `await asynchronous()` in an async one: for code that comes
    in two forms written apart (a LangChain middleware's `wrap_model_call` and
    `awrap_model_call`)."""

    sync: Callable[[], Any]
    asynchronous: Callable[[], Awaitable[Any]]

    def run(self) -> Any:
        return self.sync()

    async def arun(self, config: RunnableConfig) -> Any:
        return await self.asynchronous()


Steps = Generator[Step, Any, T]


def drive(steps: Steps[T]) -> T:
    """Run a step generator to its result, each step in place."""
    # `_advance` awaits nothing that suspends here, so one `send` runs it to the end.
    try:
        _advance(steps, _in_place).send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a step suspended in a synchronous run")


async def adrive(steps: Steps[T], config: RunnableConfig) -> T:
    """Run a step generator to its result, awaiting each step."""

    async def awaited(step: Step) -> Any:
        return await step.arun(config)

    return await _advance(steps, awaited)


async def _in_place(step: Step) -> Any:
    return step.run()


async def _advance(steps: Steps[T], carry_out: Callable[[Step], Awaitable[Any]]) -> T:
    """The one loop both drivers run: send each step's result back, or throw its error."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as done:
            return done.value
        try:
            result, error = await carry_out(step), None
        except Exception as exc:
            result, error = None, exc
