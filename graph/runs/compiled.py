"""`CyreneGraph`: the compiled loop, with the checks and defaults every run gets.

A run is admitted at the boundary before any node runs (an empty turn, or a
resume with nothing to resume, is a plain `ValueError`), runs as what its
thread and turn were opened as (`nodes.core.env.bound_env`: a resume of a group
turn is that group's, whatever context it brings), holds its session's
lock for the length of the turn (`graph.sessions`: one turn at a time per
thread, and `Sessions.busy_policy` for a message that arrives mid-turn),
runs with `LoopConfig.durability` unless told otherwise, and tells background
work while a turn is in flight. Everything else is LangGraph's.

This module holds the class and the order of a run's steps (`CyreneGraph._steps`), the
turn itself, and the doors LangGraph opens beside a run (the whole transcript,
`update_state`). Admitting and binding a run is `graph.runs.opening`; what a run runs
once it holds its session is `graph.runs.claims`; its trace's facts, `graph.runs.traces`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphBubbleUp
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, StateUpdate

from graph.runs.claims import (
    ANSWERED,
    answer,
    claimed_input,
    finish_dead_step,
    nothing_to_resume,
    resumable,
)
from graph.runs.opening import (
    admitted_updates,
    asked_run,
    bind,
    check_command,
    opening,
    reader,
    still_unbound,
)
from graph.runs.traces import TraceFacts, edit_traced, traced
from graph.sessions.binding import Asked, aopened_as, opened_as
from graph.sessions.gate import (
    SessionGate,
    entry_for,
    holding,
    ids_given,
    inbox_for,
    refuse_reentry,
    session_of,
    with_ids,
)
from graph.sessions.inbox import Answered
from graph.sessions.settings import BusyPolicy
from graph.storage.archive import archive_for, whole_transcript
from nodes.core.env import PersonaOf
from nodes.core.protocols import TranscriptArchive
from nodes.extraction.background import TURNS
from nodes.kernel.compat import CONFIG_KEY_DURABILITY, checkpointer_of
from nodes.kernel.images import MAX_IMAGE_BYTES
from nodes.kernel.run_config import configurable, thread_id
from nodes.kernel.steps import Either, Steps, Stream, adrive_streaming, drive_streaming

log = logging.getLogger("cyrene.sessions")


class CyreneGraph(CompiledStateGraph):
    """The compiled loop. It checks a run's input at the boundary, so an empty
    turn or a resume with nothing to resume fails with a plain `ValueError`
    before any node runs; it runs one turn at a time per session, under
    `Sessions.busy_policy`; it runs with `LoopConfig.durability` unless told
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
        persona_of: PersonaOf = lambda env: env.persona_id,
        clock: Callable[[], datetime] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        """Dates each admitted message (`nodes.kernel.transcript.SAID_AT`)."""
        self.trace_facts = trace_facts
        self.records_turns = records_turns
        self.persona_of = persona_of
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

    def _state(self, config: RunnableConfig | None) -> Steps:
        return (yield Either(self.get_state, self.aget_state, (config or {},)))

    def _saved(self, config: RunnableConfig) -> Either:
        """The saver's checkpoint tuple at `config`, with its pending writes."""
        return Either(self._saver.get_tuple, self._saver.aget_tuple, (config,))

    def _latest_id(self, config: RunnableConfig | None) -> Steps:
        at = self._at(config, None)
        saved = yield self._saved(at)
        return configurable(saved.config)["checkpoint_id"] if saved else ""

    # -- a run, as steps ------------------------------------------------------------------
    def _steps(
        self, asking: Callable[[], Asked], config: RunnableConfig | None, kwargs: dict
    ) -> Steps:
        """The run, as steps that `stream` carries out in its thread and `astream` awaits:
        admit it (`asking`), bind it to what its thread was opened as, wait for the session,
        work out what to run, run it (or hand over the state another caller's turn answered
        with), and give the session back. A turn's `Stream` is yielded here, not from a
        generator this one delegates to: a caller stopping early throws in GeneratorExit, and
        Python closes a delegate, where the `finally` could no longer give the session back."""
        asked = asking()
        if isinstance(asked.input, Command) and self._saves_itself:
            yield from check_command(self, asked.input, config)
        bound = yield from bind(self, asked, config)
        kwargs = {**kwargs, "context": bound.env}
        config = traced(self.trace_facts, config, bound.env)
        if (thread := self._session(config)) is None:
            input = bound.input
            if input is None and self._saves_itself and not (yield from resumable(self, config)):
                raise nothing_to_resume(config)
            yield self._turn(opening(self, input, bound), config, self._run_kwargs(config, kwargs))
            return None
        input = with_ids(bound.input)
        gate = self._gate()
        refuse_reentry(gate.inbox, thread)
        entry = entry_for(thread, input, bound.env, config)
        outcome = yield from gate.wait_turn(entry)
        if isinstance(outcome, Answered):
            return (yield from answer(self, outcome.checkpoint_id, config, kwargs))
        answered: str | None = None
        try:
            resendable = ids_given(bound.input)
            run_input = yield from claimed_input(self, outcome, input, config, resendable)
            if run_input is ANSWERED:
                answered = ""
                return (yield from answer(self, None, config, kwargs))
            # Read once for both checks: the session is held, so no other turn writes it.
            saved = yield self._saved(self._at(config, None))
            if bound.opens_thread:  # another caller may have opened it while this one waited
                yield from still_unbound(self, bound.env, config, saved)
            with holding(gate.inbox, thread):
                if isinstance(run_input, dict):
                    yield from finish_dead_step(self, config, saved)
                opened = opening(self, run_input, bound)
                yield self._turn(opened, config, self._run_kwargs(config, kwargs))
            answered = (yield from self._latest_id(config)) if outcome.merged else ""
        finally:
            yield gate.release(outcome, answered)
        return None

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
        """LangGraph's, with every update's values admitted first (`admit_state_update`)
        and the thread's facts on its trace: `update_state` comes here too."""
        saver = reader(self, config)
        thread = str(thread_id(config))
        actor = opened_as(saver, thread).actor if saver is not None else None
        admitted = admitted_updates(supersteps, actor)
        edit = edit_traced(self.trace_facts, config, actor)
        return super().bulk_update_state(edit, admitted)

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        """`bulk_update_state`, awaited (`aupdate_state` comes here too)."""
        saver = reader(self, config)
        thread = str(thread_id(config))
        actor = (await aopened_as(saver, thread)).actor if saver is not None else None
        admitted = admitted_updates(supersteps, actor)
        edit = edit_traced(self.trace_facts, config, actor)
        return await super().abulk_update_state(edit, admitted)

    # -- the turn, and carrying the steps out ------------------------------------------------
    def _turn(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> Stream:
        """The turn itself: LangGraph's stream, counted in `TURNS`; its chunks go to the caller."""
        return Stream(self._chunks, self._achunks, (input, config, kwargs))

    def _chunks(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> Iterator:
        with TURNS.turn():
            yield from super().stream(input, config, **kwargs)

    async def _achunks(
        self, input: Any, config: RunnableConfig | None, kwargs: dict
    ) -> AsyncIterator:
        with TURNS.turn():
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk

    def _drain(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> None:
        """A turn that is not the caller's (a dead turn finished first): its chunks are
        dropped, and its failure is logged, not raised."""
        with _logged():
            deque(self._chunks(input, config, kwargs), maxlen=0)

    async def _adrain(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> None:
        with _logged():
            async for _ in self._achunks(input, config, kwargs):
                pass

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator:
        """The run's steps carried out in this thread, the turn's chunks streamed."""
        asked = asked_run(self, input, config, kwargs)
        return drive_streaming(self._steps(lambda: asked, config, kwargs))

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator:
        """`stream`, awaited: the same steps, with the event loop free while the call waits.
        Its input is admitted at the first `anext`, as LangGraph's async generator's is."""
        asking = partial(asked_run, self, input, config, kwargs)
        return adrive_streaming(self._steps(asking, config, kwargs))


@contextmanager
def _logged() -> Iterator[None]:
    """A quiet run's failure is logged: the caller's own turn goes on."""
    try:
        yield
    except GraphBubbleUp:
        raise
    except Exception:
        log.exception("finishing the turn a dead run left failed; the new turn goes on")


def _thread_key(config: RunnableConfig) -> tuple[str, str]:
    return str(thread_id(config)), str(configurable(config).get("checkpoint_ns", ""))
