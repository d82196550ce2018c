"""`CyreneGraph`: the compiled loop, with the checks and defaults every run gets.

A run is admitted at the boundary before any node runs (an empty turn, or a
resume with nothing to resume, is a plain `ValueError`), holds its session's
lock for the length of the turn (`graph.sessions`: one turn at a time per
thread, and `LoopConfig.busy_policy` for a message that arrives mid-turn),
runs with `LoopConfig.durability` unless told otherwise, and tells background
work while a turn is in flight. Everything else is LangGraph's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability

from graph.session_ledger import Answered, Claim
from graph.sessions import (
    SessionGate,
    answered_chunks,
    entry_for,
    ledger_for,
    merged_input,
    session_of,
    with_ids,
)
from memory.background import TURNS
from nodes.boundary import admit
from nodes.compat import CONFIG_KEY_DURABILITY
from nodes.config import BusyPolicy
from nodes.run_config import configurable, thread_id

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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.default_durability = default_durability
        self.busy_policy = busy_policy
        self.busy_timeout = busy_timeout

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
        return SessionGate(ledger_for(self._saver), self.busy_policy, self.busy_timeout)

    @staticmethod
    def _at(config: RunnableConfig | None, checkpoint_id: str | None) -> RunnableConfig:
        """The session's latest checkpoint, or the one with `checkpoint_id`."""
        thread = configurable(config)["thread_id"]
        at = {"thread_id": thread, "checkpoint_ns": ""}
        return {"configurable": {**at, "checkpoint_id": checkpoint_id} if checkpoint_id else at}

    def _resumable(self, config: RunnableConfig) -> bool:
        # A crash can land after a task's writes were saved but before the next
        # checkpoint was: `next` is then empty, yet LangGraph resumes from the writes.
        saved = self._saver.get_tuple(config)
        return saved is not None and bool(saved.pending_writes or self.get_state(config).next)

    async def _aresumable(self, config: RunnableConfig) -> bool:
        saved = await self._saver.aget_tuple(config)
        return saved is not None and bool(
            saved.pending_writes or (await self.aget_state(config)).next
        )

    # -- sync ---------------------------------------------------------------------------
    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator:
        input, kwargs["context"] = admit(input, config, kwargs.get("context"))
        if (thread := self._session(config)) is None:
            if input is None and self._saves_itself and not self._resumable(config or {}):
                raise _nothing_to_resume(config)
            return self._as_turn(super().stream(input, config, **self._run_kwargs(config, kwargs)))
        input = with_ids(input)
        entry = entry_for(thread, input, kwargs["context"], config)
        return self._locked(self._gate(), entry, input, config, kwargs)

    def _locked(
        self, gate: SessionGate, entry: Any, input: Any, config: Any, kwargs: dict
    ) -> Iterator:
        """The run, once the session is ours; or the state another caller's turn answered with."""
        outcome = gate.wait_turn(entry)
        if isinstance(outcome, Answered):
            yield from self._answer(outcome.checkpoint_id, config, kwargs)
            return
        answered: str | None = None
        try:
            run_input = self._claimed_input(outcome, input, config)
            if run_input is ANSWERED:
                answered = ""
                yield from self._answer(None, config, kwargs)
                return
            with TURNS.turn():
                yield from super().stream(run_input, config, **self._run_kwargs(config, kwargs))
            answered = self._latest_id(config) if outcome.merged else ""
        finally:
            gate.release(outcome, answered)

    def _claimed_input(self, claim: Claim, input: Any, config: Any) -> Any:
        if claim.recovering:
            messages = self.get_state(self._at(config, None)).values.get("messages", [])
            return recovered_input(claim, input, {m.id for m in messages}, self._resumable(config))
        if input is None and not self._resumable(config):
            raise _nothing_to_resume(config)
        return merged_input(claim, input) if isinstance(input, dict) else input

    def _answer(self, checkpoint_id: str | None, config: Any, kwargs: dict) -> Iterator:
        values = self.get_state(self._at(config, checkpoint_id)).values
        yield from answered_chunks(values, kwargs, self.stream_mode)

    def _latest_id(self, config: Any) -> str:
        saved = self._saver.get_tuple(self._at(config, None))
        return saved.config["configurable"]["checkpoint_id"] if saved else ""

    @staticmethod
    def _as_turn(chunks: Iterator) -> Iterator:
        with TURNS.turn():
            yield from chunks

    # -- async: the same, awaited -----------------------------------------------------------
    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator:
        input, kwargs["context"] = admit(input, config, kwargs.get("context"))
        if (thread := self._session(config)) is None:
            if input is None and self._saves_itself and not await self._aresumable(config or {}):
                raise _nothing_to_resume(config)
            with TURNS.turn():
                async for chunk in super().astream(
                    input, config, **self._run_kwargs(config, kwargs)
                ):
                    yield chunk
            return
        input = with_ids(input)
        entry = entry_for(thread, input, kwargs["context"], config)
        gate = self._gate()
        outcome = await gate.await_turn(entry)
        if isinstance(outcome, Answered):
            for chunk in await self._aanswer(outcome.checkpoint_id, config, kwargs):
                yield chunk
            return
        answered: str | None = None
        try:
            run_input = await self._aclaimed_input(outcome, input, config)
            if run_input is ANSWERED:
                answered = ""
                for chunk in await self._aanswer(None, config, kwargs):
                    yield chunk
                return
            with TURNS.turn():
                async for chunk in super().astream(
                    run_input, config, **self._run_kwargs(config, kwargs)
                ):
                    yield chunk
            answered = await self._alatest_id(config) if outcome.merged else ""
        finally:
            await gate.arelease(outcome, answered)

    async def _aclaimed_input(self, claim: Claim, input: Any, config: Any) -> Any:
        if claim.recovering:
            messages = (await self.aget_state(self._at(config, None))).values.get("messages", [])
            resumable = await self._aresumable(config)
            return recovered_input(claim, input, {m.id for m in messages}, resumable)
        if input is None and not await self._aresumable(config):
            raise _nothing_to_resume(config)
        return merged_input(claim, input) if isinstance(input, dict) else input

    async def _aanswer(self, checkpoint_id: str | None, config: Any, kwargs: dict) -> list:
        values = (await self.aget_state(self._at(config, checkpoint_id))).values
        return answered_chunks(values, kwargs, self.stream_mode)

    async def _alatest_id(self, config: Any) -> str:
        saved = await self._saver.aget_tuple(self._at(config, None))
        return saved.config["configurable"]["checkpoint_id"] if saved else ""
