"""Work that may block, and one step driver for the sync and async forms of the same code.

An async run hands work that may block (a Chroma search, a user's hook, sink,
guard or `transform_context`, an inbox in a database) to a worker thread, and
runs everything else right on the event loop. A hop costs two thread switches,
a GIL hand-off and a place in the loop's default executor (min(32, cores + 4)
threads: 6 on 2 cores); with dozens of sessions in flight that queue, not the
work, sets the turn rate. So whether work blocks is declared by whoever owns it
(a round policy, a hook, an inbox) and read once, at build time.

Code whose sync and async twins would differ only in how they wait (the model
node, a run of the graph, the wait for a session's lock) is written once, as a
generator of steps: `Work`, `Either`, or any object with `run` and `arun`. It
is driven by `drive` or `adrive`; an exception a step raises (a cancellation
too) is thrown back into the generator at the `yield`, so `try`/`except` and
`finally` around a step work as in plain code. A run of the graph streams: its
`Stream` steps' chunks go out to the caller as they come, through
`drive_streaming` and `adrive_streaming`, thin layers over the same driver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from langchain_core.runnables.config import run_in_executor

T = TypeVar("T")


async def off_loop(blocks: bool, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`: when it may block, on a thread of the loop's default executor with this
    context's variables, else here on the event loop."""
    if blocks:
        return await run_in_executor(None, fn, *args)
    return fn(*args)


class Step(Protocol):
    """One thing a step generator waits for: done in place, or awaited in an async run."""

    def run(self) -> Any: ...

    async def arun(self) -> Any: ...


@dataclass(frozen=True)
class Work:
    """`fn(*args)`, on a worker thread in an async run when it `blocks`."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    blocks: bool = False

    def run(self) -> Any:
        return self.fn(*self.args)

    async def arun(self) -> Any:
        return await off_loop(self.blocks, self.fn, *self.args)


@dataclass(frozen=True)
class Either:
    """`sync(*args)` in a sync run, `await asynchronous(*args)` in an async one: for code that
    comes in two forms written apart (a saver's `get_tuple` and `aget_tuple`, a LangChain
    middleware's `wrap_model_call` and `awrap_model_call`)."""

    sync: Callable[..., Any]
    asynchronous: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()

    def run(self) -> Any:
        return self.sync(*self.args)

    async def arun(self) -> Any:
        return await self.asynchronous(*self.args)


@dataclass(frozen=True)
class Stream:
    """Chunks for the caller, passed on as they come while the step runs (a graph's turn):
    `sync(*args)` iterates them in a sync run, `asynchronous(*args)` in an async one. It
    comes to None."""

    sync: Callable[..., Iterator[Any]]
    asynchronous: Callable[..., AsyncIterator[Any]]
    args: tuple[Any, ...] = ()


Steps = Generator[Step | Stream, Any, T]


def drive(steps: Steps[T]) -> T:
    """Run a step generator to its result, each step in place."""
    return _finished(_synchronously(_advance(steps, _in_place)))


async def adrive(steps: Steps[T]) -> T:
    """Run a step generator to its result, awaiting each step."""
    return _finished(await _advance(steps, _awaited))


def drive_streaming(steps: Steps[Any]) -> Iterator[Any]:
    """Run a step generator in place, yielding each `Stream` step's chunks as they come."""
    error: BaseException | None = None
    while isinstance(out := _synchronously(_advance(steps, _in_place, error)), Stream):
        try:
            yield from out.sync(*out.args)
            error = None
        except BaseException as exc:  # the caller stopping early too: the steps clean up
            error = exc


async def adrive_streaming(steps: Steps[Any]) -> AsyncIterator[Any]:
    """`drive_streaming`, awaiting each step."""
    error: BaseException | None = None
    while isinstance(out := await _advance(steps, _awaited, error), Stream):
        try:
            async for chunk in out.asynchronous(*out.args):
                yield chunk
            error = None
        except BaseException as exc:
            error = exc


@dataclass(frozen=True, slots=True)
class _Finished(Generic[T]):
    value: T


async def _advance(
    steps: Steps[T],
    carry_out: Callable[[Step], Awaitable[Any]],
    error: BaseException | None = None,
) -> Stream | _Finished[T]:
    """The one loop every driver runs: carry out each step and send its result back, or
    throw its exception back in (`error`: the last `Stream`'s), until the steps finish or
    hand over a `Stream` for the caller."""
    result: Any = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as done:
            return _Finished(done.value)
        if isinstance(step, Stream):
            return step
        try:
            result, error = await carry_out(step), None
        except BaseException as exc:
            result, error = None, exc


def _synchronously(advancing: Coroutine[Any, Any, Stream | _Finished[T]]) -> Stream | _Finished[T]:
    """What `_advance` over steps run in place comes to: it awaits nothing that suspends,
    so one `send` runs it to the end."""
    try:
        advancing.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a step suspended in a synchronous run")


def _finished(out: Stream | _Finished[T]) -> T:
    if isinstance(out, Stream):
        raise TypeError("a Stream step has no caller to go to: drive it with drive_streaming")
    return out.value


async def _in_place(step: Step) -> Any:
    return step.run()


async def _awaited(step: Step) -> Any:
    return await step.arun()
