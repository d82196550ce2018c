"""`CyreneGraph`: the compiled loop, with the checks and defaults every run gets.

A run is admitted at the boundary before any node runs (an empty turn, or a
resume with nothing to resume, is a plain `ValueError`), holds its session's
lock for the length of the turn (`graph.sessions`: one turn at a time per
thread, and `LoopConfig.busy_policy` for a message that arrives mid-turn),
runs with `LoopConfig.durability` unless told otherwise, and tells background
work while a turn is in flight. Everything else is LangGraph's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, StateUpdate

from graph.sessions.gate import (
    SessionGate,
    answered_chunks,
    entry_for,
    holding,
    inbox_for,
    merged_input,
    refuse_reentry,
    session_of,
    with_ids,
)
from graph.sessions.inbox import Answered, Claim
from graph.storage.archive import archive_for, whole_transcript
from memory.background import TURNS
from nodes.boundary import admit, admit_state_update
from nodes.compat import CONFIG_KEY_DURABILITY, checkpointer_of
from nodes.config import BusyPolicy
from nodes.env import SessionEnv
from nodes.extraction import opened_turn
from nodes.protocols import TranscriptArchive
from nodes.run_config import configurable, thread_id
from nodes.view.images import MAX_IMAGE_BYTES

TraceFacts = Callable[[SessionEnv, RunnableConfig | None], dict[str, Any]]
"""What a trace of a run says about its session (`nodes.loop.Loop.trace_facts`)."""
ANSWERED = object()
"""A recovered message that is stored and whose turn is complete: nothing to run."""


class NothingToResumeError(ValueError):
    """`invoke(None, thread)` on a thread with no interrupted turn."""


def _nothing_to_resume(config: RunnableConfig | None) -> NothingToResumeError:
    thread = thread_id(config)
    return NothingToResumeError(
        f"thread {thread!r} has no interrupted turn to resume; send a message to start one"
    )


def recovered_input(claim: Claim, input: Any, stored: set[str], resumable: bool) -> Any:
    """What to run for a message a turn took but never answered (that turn failed, or
    its process died): a turn of its own if it was never stored, else a resume of
    the interrupted turn, else nothing (`ANSWERED`)."""
    if not all(m.id in stored for m in claim.entry.messages):
        return input
    return None if resumable else ANSWERED


# -- a run's steps, as `SessionGate._steps` does it: one generator, two drivers ------------


@dataclass
class _Ask:
    """A read of the saver or state, or a lock operation: `get` from a sync run,
    `aget` from an async one; the step generator is sent what it returns."""

    get: Callable[..., Any]
    aget: Callable[..., Awaitable[Any]]
    args: tuple = ()


@dataclass
class _Run:
    """The turn itself: LangGraph's stream, counted in `TURNS`; its chunks go to the caller."""

    input: Any
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Emit:
    """Chunks for the caller that no turn of its own produced (another caller's turn
    answered it)."""

    chunks: list[Any]


Step = _Ask | _Run | _Emit
Steps = Generator[Step, Any, Any]


class _Stepper:
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


class CyreneGraph(CompiledStateGraph):
    """The compiled loop. It checks a run's input at the boundary, so an empty
    turn or a resume with nothing to resume fails with a plain `ValueError`
    before any node runs; it runs one turn at a time per session, under
    `LoopConfig.busy_policy`; it runs with `LoopConfig.durability` unless told
    otherwise; and it tells background work when turns run. Everything else
    is LangGraph's."""

    def __init__(
        self,
        *,
        default_durability: Durability = "sync",
        busy_policy: BusyPolicy = "merge",
        busy_timeout: float = 300.0,
        max_image_bytes: int = MAX_IMAGE_BYTES,
        trace_facts: TraceFacts | None = None,
        records_turns: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.trace_facts = trace_facts
        self.records_turns = records_turns
        self.default_durability = default_durability
        self.busy_policy = busy_policy
        self.busy_timeout = busy_timeout
        self.max_image_bytes = max_image_bytes

    @property
    def _saves_itself(self) -> bool:
        """Whether this graph holds its own saver; otherwise a parent, Studio or nobody saves."""
        return isinstance(self.checkpointer, BaseCheckpointSaver)

    def _run_kwargs(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Fill in our durability unless the run or a parent graph chose one, or nothing saves.

        `checkpoint_during` is LangGraph's deprecated spelling and excludes `durability`."""
        chosen = (
            not self._saves_itself
            or kwargs.get("durability") is not None
            or kwargs.get("checkpoint_during") is not None
            or CONFIG_KEY_DURABILITY in configurable(config)
        )
        return kwargs if chosen else {**kwargs, "durability": self.default_durability}

    def _session(self, config: RunnableConfig | None) -> str | None:
        """The thread whose lock a run takes. Without a saver of its own (Studio
        injects one per run, and keeps its own multitask handling) none is."""
        return session_of(config) if self._saves_itself else None

    @property
    def _saver(self) -> BaseCheckpointSaver:
        """The graph's own saver (only asked for when `_saves_itself`)."""
        assert isinstance(self.checkpointer, BaseCheckpointSaver)
        return self.checkpointer

    def _gate(self) -> SessionGate:
        return SessionGate(inbox_for(self._saver), self.busy_policy, self.busy_timeout)

    @staticmethod
    def _at(config: RunnableConfig | None, checkpoint_id: str | None) -> RunnableConfig:
        """The session's latest checkpoint, or the one with `checkpoint_id`."""
        at = {"thread_id": thread_id(config), "checkpoint_ns": ""}
        return {"configurable": {**at, "checkpoint_id": checkpoint_id} if checkpoint_id else at}

    # -- a run, as steps ------------------------------------------------------------------
    def _steps(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> Steps:
        """The run, as steps that `stream` carries out in its thread and `astream` awaits:
        wait for the session, work out what to run, run it (or hand over the state
        another caller's turn answered with), and give the session back."""
        if isinstance(input, Command) and self._saves_itself:
            yield from self._check_command(input, config)
        if (thread := self._session(config)) is None:
            if input is None and self._saves_itself and not (yield from self._resumable(config)):
                raise _nothing_to_resume(config)
            yield _Run(self._opening(input, kwargs["context"]), self._run_kwargs(config, kwargs))
            return None
        input = with_ids(input)
        gate = self._gate()
        refuse_reentry(gate.inbox, thread)
        entry = entry_for(thread, input, kwargs["context"], config)
        outcome = yield _Ask(gate.wait_turn, gate.await_turn, (entry,))
        if isinstance(outcome, Answered):
            return (yield from self._answer(outcome.checkpoint_id, config, kwargs))
        answered: str | None = None
        try:
            run_input = yield from self._claimed_input(outcome, input, config)
            if run_input is ANSWERED:
                answered = ""
                return (yield from self._answer(None, config, kwargs))
            with holding(gate.inbox, thread):
                opening = self._opening(run_input, kwargs["context"])
                yield _Run(opening, self._run_kwargs(config, kwargs))
            answered = (yield from self._latest_id(config)) if outcome.merged else ""
        finally:
            yield _Ask(gate.release, gate.arelease, (outcome, answered))
        return None

    def _opening(self, input: Any, env: Any) -> Any:
        """A new turn's input, with the record `extract_memory` reads should its run die
        (`nodes.extraction.opened_turn`); any other input as it is."""
        if not self.records_turns or not isinstance(input, dict):
            return input
        return opened_turn(with_ids(input), env if isinstance(env, SessionEnv) else SessionEnv())

    def _check_command(self, command: Command, config: RunnableConfig | None) -> Steps:
        """A `Command` continues a session: refused when no human message would be in it
        (a resume or `goto` would call the model with nothing said)."""
        update = command.update if isinstance(command.update, dict) else {}
        if any(isinstance(m, HumanMessage) for m in update.get("messages") or []):
            return
        stored = (yield from self._state(self._at(config, None))).values.get("messages", [])
        if not any(isinstance(m, HumanMessage) for m in stored):
            raise ValueError(
                f"thread {thread_id(config)!r} has no human message: a Command continues a "
                "session and cannot start one; send a message"
            )

    def _resumable(self, config: RunnableConfig | None) -> Steps:
        # A crash can land after a task's writes were saved but before the next
        # checkpoint was: `next` is then empty, yet LangGraph resumes from the writes.
        saved = yield _Ask(self._saver.get_tuple, self._saver.aget_tuple, (config or {},))
        if saved is None:
            return False
        return bool(saved.pending_writes or (yield from self._state(config)).next)

    def _state(self, config: RunnableConfig | None) -> Steps:
        return (yield _Ask(self.get_state, self.aget_state, (config or {},)))

    def _claimed_input(self, claim: Claim, input: Any, config: RunnableConfig | None) -> Steps:
        if claim.recovering:
            messages = (yield from self._state(self._at(config, None))).values.get("messages", [])
            resumable = yield from self._resumable(config)
            return recovered_input(claim, input, {m.id for m in messages}, resumable)
        if input is None and not (yield from self._resumable(config)):
            raise _nothing_to_resume(config)
        return merged_input(claim, input) if isinstance(input, dict) else input

    def _answer(
        self, checkpoint_id: str | None, config: RunnableConfig | None, kwargs: dict
    ) -> Steps:
        values = (yield from self._state(self._at(config, checkpoint_id))).values
        yield _Emit(answered_chunks(values, kwargs, self.stream_mode))

    def _latest_id(self, config: RunnableConfig | None) -> Steps:
        at = self._at(config, None)
        saved = yield _Ask(self._saver.get_tuple, self._saver.aget_tuple, (at,))
        return configurable(saved.config)["checkpoint_id"] if saved else ""

    def _admit(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> tuple[Any, Any]:
        return admit(input, config, kwargs.get("context"), max_image_bytes=self.max_image_bytes)

    def _traced(self, config: RunnableConfig | None, context: Any) -> RunnableConfig | None:
        """`config` with the session's facts in its metadata (`Loop.trace_facts`): every
        LangChain run of the turn inherits them, so a trace tells sessions apart."""
        if self.trace_facts is None or not isinstance(context, SessionEnv):
            return config
        facts = self.trace_facts(context, config)
        return {**(config or {}), "metadata": {**(config or {}).get("metadata", {}), **facts}}

    # -- the whole transcript ---------------------------------------------------------------
    def transcript(
        self, config: RunnableConfig, start: int = 0, stop: int | None = None
    ) -> list[BaseMessage]:
        """Messages [start, stop) of the session's whole transcript, oldest first.

        `get_state(config).values["messages"]` is the live window a long session
        keeps; the messages compaction moved out of it are in the transcript
        archive beside the checkpoints. This reads both, a page at a time:
        `transcript(config, 0, 100)`, then `(config, 100, 200)`, … Positions count
        from the session's first message, whatever was archived since.
        """
        values = self.get_state(config).values
        return whole_transcript(self._archive(config), _thread_key(config), values, start, stop)

    async def atranscript(
        self, config: RunnableConfig, start: int = 0, stop: int | None = None
    ) -> list[BaseMessage]:
        """`transcript`, awaited (the archive is read on a worker thread)."""
        values = (await self.aget_state(config)).values
        where = _thread_key(config)
        return await asyncio.to_thread(
            whole_transcript, self._archive(config), where, values, start, stop
        )

    def _archive(self, config: RunnableConfig) -> TranscriptArchive | None:
        saver = self.checkpointer if self._saves_itself else checkpointer_of(config)
        return archive_for(saver) if isinstance(saver, BaseCheckpointSaver) else None

    # -- state edits from outside a turn ---------------------------------------------------
    def bulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        """LangGraph's, with every update's values admitted first (`admit_state_update`):
        `update_state` comes here too."""
        return super().bulk_update_state(config, _admitted(supersteps))

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        """`bulk_update_state`, awaited (`aupdate_state` comes here too)."""
        return await super().abulk_update_state(config, _admitted(supersteps))

    # -- the two drivers --------------------------------------------------------------------
    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator:
        input, kwargs["context"] = self._admit(input, config, kwargs)
        config = self._traced(config, kwargs["context"])
        return self._drive(_Stepper(self._steps(input, config, kwargs)), config)

    def _drive(self, steps: _Stepper, config: RunnableConfig | None) -> Iterator:
        """Carry out a run's steps in this thread, streaming the turn's chunks."""
        while (step := steps.next()) is not None:
            try:
                if isinstance(step, _Run):
                    with TURNS.turn():
                        yield from super().stream(step.input, config, **step.kwargs)
                elif isinstance(step, _Emit):
                    yield from step.chunks
                steps.answer(step.get(*step.args) if isinstance(step, _Ask) else None)
            except BaseException as exc:
                steps.fail(exc)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator:
        """`stream`, awaited: the same steps, with the event loop free while the call waits."""
        input, kwargs["context"] = self._admit(input, config, kwargs)
        config = self._traced(config, kwargs["context"])
        steps = _Stepper(self._steps(input, config, kwargs))
        while (step := steps.next()) is not None:
            try:
                if isinstance(step, _Run):
                    with TURNS.turn():
                        async for chunk in super().astream(step.input, config, **step.kwargs):
                            yield chunk
                elif isinstance(step, _Emit):
                    for chunk in step.chunks:
                        yield chunk
                steps.answer(await step.aget(*step.args) if isinstance(step, _Ask) else None)
            except BaseException as exc:
                steps.fail(exc)


def _thread_key(config: RunnableConfig) -> tuple[str, str]:
    return str(thread_id(config)), str(configurable(config).get("checkpoint_ns", ""))


def _admitted(supersteps: Sequence[Sequence[StateUpdate]]) -> list[list[StateUpdate]]:
    """Every update's values through the boundary; nothing is applied if one is refused."""
    return [
        [update._replace(values=admit_state_update(update.values)) for update in step]
        for step in supersteps
    ]
