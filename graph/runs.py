"""`CyreneGraph`: the compiled loop, with the checks and defaults every run gets.

A run is admitted at the boundary before any node runs (an empty turn, or a
resume with nothing to resume, is a plain `ValueError`), runs as what its
thread and turn were opened as (`nodes.core.env.bound_env`: a resume of a group
turn is that group's, whatever context it brings), holds its session's
lock for the length of the turn (`graph.sessions`: one turn at a time per
thread, and `Sessions.busy_policy` for a message that arrives mid-turn),
runs with `LoopConfig.durability` unless told otherwise, and tells background
work while a turn is in flight. Everything else is LangGraph's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.errors import GraphBubbleUp
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, StateUpdate

from graph.sessions.binding import (
    Asked,
    Bound,
    aopened_as,
    opened_actor,
    opened_as,
    refuse_unrecorded_restricted,
)
from graph.sessions.gate import (
    SessionGate,
    answered_chunks,
    entry_for,
    holding,
    ids_given,
    inbox_for,
    merged_input,
    refuse_reentry,
    session_of,
    with_ids,
)
from graph.sessions.inbox import Answered, Claim
from graph.sessions.settings import BusyPolicy
from graph.storage.archive import archive_for, whole_transcript
from nodes.boundary.admission import admit, admit_state_update
from nodes.core.env import PersonaOf, SessionEnv, bound_env
from nodes.core.loop import TRACE_ACTOR, TRACE_SESSION, UNBOUND_ACTOR
from nodes.core.protocols import TranscriptArchive
from nodes.core.state import OPENED_AS, OpenedAs
from nodes.extraction.background import TURNS
from nodes.extraction.node import opened_turn, turn_env
from nodes.kernel.compat import (
    CONFIG_KEY_DURABILITY,
    checkpointer_of,
    inside_parent_run,
    parent_context,
)
from nodes.kernel.images import MAX_IMAGE_BYTES
from nodes.kernel.run_config import configurable, thread_id
from nodes.kernel.steps import Either, Steps, Stream, adrive_streaming, drive_streaming

log = logging.getLogger("cyrene.sessions")
MESSAGES = "messages"
"""The transcript's channel."""


def final_reply(write: tuple[str, str, Any]) -> bool:
    """Whether a saved write `(task, channel, value)` stores a reply that asks for no tool."""
    _, channel, value = write
    written = value if isinstance(value, list) else [value]
    return channel == MESSAGES and any(
        isinstance(m, AIMessage) and not m.tool_calls for m in written
    )


TraceFacts = Callable[[SessionEnv, RunnableConfig | None], dict[str, Any]]
"""What a trace of a run says about its session (`nodes.core.loop.Loop.trace_facts`)."""
ANSWERED = object()
"""A recovered or re-sent message that is stored and whose turn is complete: nothing to run."""


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
            yield from self._check_command(asked.input, config)
        bound = yield from self._bind(asked, config)
        kwargs = {**kwargs, "context": bound.env}
        config = self._traced(config, bound.env)
        if (thread := self._session(config)) is None:
            input = bound.input
            if input is None and self._saves_itself and not (yield from self._resumable(config)):
                raise _nothing_to_resume(config)
            yield self._turn(self._opening(input, bound), config, self._run_kwargs(config, kwargs))
            return None
        input = with_ids(bound.input)
        gate = self._gate()
        refuse_reentry(gate.inbox, thread)
        entry = entry_for(thread, input, bound.env, config)
        outcome = yield from gate.wait_turn(entry)
        if isinstance(outcome, Answered):
            return (yield from self._answer(outcome.checkpoint_id, config, kwargs))
        answered: str | None = None
        try:
            resendable = ids_given(bound.input)
            run_input = yield from self._claimed_input(outcome, input, config, resendable)
            if run_input is ANSWERED:
                answered = ""
                return (yield from self._answer(None, config, kwargs))
            # Read once for both checks: the session is held, so no other turn writes it.
            saved = yield self._saved(self._at(config, None))
            if bound.opens_thread:  # another caller may have opened it while this one waited
                yield from self._still_unbound(bound.env, config, saved)
            with holding(gate.inbox, thread):
                if isinstance(run_input, dict):
                    yield from self._finish_dead_step(config, saved)
                opening = self._opening(run_input, bound)
                yield self._turn(opening, config, self._run_kwargs(config, kwargs))
            answered = (yield from self._latest_id(config)) if outcome.merged else ""
        finally:
            yield gate.release(outcome, answered)
        return None

    def _opening(self, input: Any, bound: Bound) -> Any:
        """A new turn's input, with the record a resume continues as and `extract_memory`
        reads should its run die (`nodes.extraction.node.opened_turn`), and, where the thread's
        latest checkpoint lacks it, what the thread is opened as (a `Command` carries that
        too); a resume as it is."""
        if isinstance(input, Command) and bound.opens_thread:
            record = {OPENED_AS: OpenedAs(actor=bound.env.actor)}
            update = input.update if isinstance(input.update, dict) else {}
            return dataclasses.replace(input, update={**update, **record})
        if not isinstance(input, dict):
            return input
        env = bound.env.model_copy(update={"persona_id": self.persona_of(bound.env)})
        opened = opened_turn(with_ids(input), env, extracts=self.records_turns)
        return {**opened, OPENED_AS: OpenedAs(actor=env.actor)} if bound.opens_thread else opened

    # -- what the thread and its turn were opened as --------------------------------------
    def _reader(self, config: RunnableConfig | None) -> BaseCheckpointSaver | None:
        """The saver holding the thread's checkpoints: ours, Studio's, or none."""
        return self._saver if self._saves_itself else checkpointer_of(config)

    def _bind(self, asked: Asked, config: RunnableConfig | None) -> Steps:
        """The run under what its thread (and, continuing a turn, that turn) was opened as
        (`nodes.core.env.bound_env`), its input admitted again if that changes the rules."""
        saver = self._reader(config)
        if saver is None or thread_id(config) is None:  # nothing is kept: nothing to bind to
            return Bound(asked.context or SessionEnv(), asked.input, False)
        opened = yield from self._opened_as(saver, config)  # the thread's, never a fork's
        actor, turn = opened.actor, None
        if not isinstance(asked.input, dict):  # a resume or a Command continues its turn
            values = (yield from self._state(config)).values
            turn = turn_env(values.get("messages", []))
            if turn is None and actor is None:
                refuse_unrecorded_restricted(values, asked.context, config)
        env = bound_env(
            asked.context,
            thread_actor=actor,
            turn=turn,
            persona_of=self.persona_of,
            thread=thread_id(config),
        )
        claimed = asked.context or SessionEnv()
        same_rules = (env.restricted, env.mentioned) == (claimed.restricted, claimed.mentioned)
        input = asked.input if same_rules else self._admit(asked.raw, config, env)[0]
        return Bound(env, input, not opened.recorded or (actor is None and turn is None))

    def _opened_as(self, saver: BaseCheckpointSaver, config: RunnableConfig | None) -> Steps:
        """The actor the run's thread was opened as (`graph.sessions.binding.opened_as`)."""
        thread = str(thread_id(config))
        return (yield Either(opened_as, aopened_as, (saver, thread)))

    def _still_unbound(
        self, env: SessionEnv, config: RunnableConfig | None, saved: CheckpointTuple | None
    ) -> Steps:
        """Refuse a first turn whose thread another caller opened as another actor first
        (`saved`: the thread's latest checkpoint, read with the session held)."""
        actor = opened_actor(saved)
        if actor is None and saved is not None:  # a fork from before the record: look back
            actor = (yield from self._opened_as(self._saver, config)).actor
        if actor is not None and actor != env.actor:
            bound_env(
                env,
                thread_actor=actor,
                turn=None,
                persona_of=self.persona_of,
                thread=thread_id(config),
            )

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

    def _finish_dead_step(
        self, config: RunnableConfig | None, saved: CheckpointTuple | None
    ) -> Steps:
        """Before a new turn: finish the turn whose run died after its final reply was saved
        and before the checkpoint after it was. A new run starts from that checkpoint and
        would drop the reply: never stored, its turn never extracted. So the dead turn is
        resumed first, as it was opened, quietly; what is left of it calls no model. A turn
        that died amid its tools is not resumed: the new message moves on, and its dangling
        calls are closed (`nodes.core.reducers`). `saved`: the thread's latest checkpoint."""
        if saved is None or not any(final_reply(w) for w in saved.pending_writes or ()):
            return
        turn = turn_env((yield from self._state(self._at(config, None))).values.get("messages", []))
        if turn is None:  # saved before turns recorded their env: who spoke is not known
            return
        kwargs = self._run_kwargs(config, {"context": turn})
        yield Either(self._drain, self._adrain, (None, self._traced(config, turn), kwargs))

    def _resumable(self, config: RunnableConfig | None) -> Steps:
        # A crash can land after a task's writes were saved but before the next
        # checkpoint was: `next` is then empty, yet LangGraph resumes from the writes.
        saved = yield self._saved(config or {})
        if saved is None:
            return False
        return bool(saved.pending_writes or (yield from self._state(config)).next)

    def _state(self, config: RunnableConfig | None) -> Steps:
        return (yield Either(self.get_state, self.aget_state, (config or {},)))

    def _saved(self, config: RunnableConfig) -> Either:
        """The saver's checkpoint tuple at `config`, with its pending writes."""
        return Either(self._saver.get_tuple, self._saver.aget_tuple, (config,))

    def _claimed_input(
        self, claim: Claim, input: Any, config: RunnableConfig | None, resendable: bool
    ) -> Steps:
        """What the claimed turn runs; `resendable`: the caller gave every message its id, so
        they may be stored already (messages given new ids never are: no state is read)."""
        if claim.recovering:
            messages = (yield from self._state(self._at(config, None))).values.get("messages", [])
            resumable = yield from self._resumable(config)
            return recovered_input(claim, input, {m.id for m in messages}, resumable)
        if input is None and not (yield from self._resumable(config)):
            raise _nothing_to_resume(config)
        if not isinstance(input, dict):
            return input
        if not claim.merged and resendable and (yield from self._answered_already(input, config)):
            return ANSWERED
        return merged_input(claim, input)

    def _answered_already(self, input: dict, config: RunnableConfig | None) -> Steps:
        """Whether every message of `input` is already in the thread and its turn is over
        (answered, or a group turn that stayed quiet): a script run twice with `id="m1"`.
        Running it again would answer one message twice. A message stored by a turn that
        failed is run again: the caller is retrying it."""
        stored = (yield from self._state(self._at(config, None))).values.get(MESSAGES, [])
        ids = {m.id for m in stored if isinstance(m, HumanMessage)}  # a reply's may collide
        sent = input.get(MESSAGES) or []
        if not sent or not all(m.id in ids for m in sent):
            return False
        return not (yield from self._resumable(config))

    def _answer(
        self, checkpoint_id: str | None, config: RunnableConfig | None, kwargs: dict
    ) -> Steps:
        """The state another caller's turn answered this call with, streamed as this run's
        `stream_mode` shapes it."""
        values = (yield from self._state(self._at(config, checkpoint_id))).values
        yield Stream(iter, _each, (answered_chunks(values, kwargs, self.stream_mode),))

    def _latest_id(self, config: RunnableConfig | None) -> Steps:
        at = self._at(config, None)
        saved = yield self._saved(at)
        return configurable(saved.config)["checkpoint_id"] if saved else ""

    def _admit(self, input: Any, config: RunnableConfig | None, context: Any) -> tuple[Any, Any]:
        now = self.clock() if self.clock is not None else None
        return admit(input, config, context, max_image_bytes=self.max_image_bytes, now=now)

    def _asked(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> Asked:
        """The run as its caller asked for it, admitted (bad input fails here, at once). A
        run as a parent graph's subgraph, given no context of its own, has its parent's
        (when that is a SessionEnv or a dict of one: a group parent stays a group)."""
        context = kwargs.get("context")
        if context is None and inside_parent_run(config):
            inherited = parent_context(config)
            context = inherited if isinstance(inherited, SessionEnv | Mapping) else None
        admitted, context = self._admit(input, config, context)
        return Asked(input, admitted, context)

    def _traced(self, config: RunnableConfig | None, context: Any) -> RunnableConfig | None:
        """`config` with the session's facts in its metadata (`Loop.trace_facts`): every
        LangChain run of the turn inherits them, so a trace tells sessions apart."""
        if self.trace_facts is None or not isinstance(context, SessionEnv):
            return config
        return _with_metadata(config, self.trace_facts(context, config))

    def _edit_traced(self, config: RunnableConfig, actor: str | None) -> RunnableConfig:
        """An `update_state` config with the thread's facts: its actor, or `UNBOUND_ACTOR`
        before any turn opened it (so a trace keeps none of its text either way)."""
        if self.trace_facts is None:
            return config
        if actor is None:
            facts = {TRACE_SESSION: thread_id(config), TRACE_ACTOR: UNBOUND_ACTOR}
        else:
            facts = self.trace_facts(SessionEnv.model_validate({"actor": actor}), config)
        return _with_metadata(config, facts) or config

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
        saver = self._reader(config)
        thread = str(thread_id(config))
        actor = opened_as(saver, thread).actor if saver is not None else None
        admitted = _admitted(supersteps, actor)
        return super().bulk_update_state(self._edit_traced(config, actor), admitted)

    async def abulk_update_state(
        self, config: RunnableConfig, supersteps: Sequence[Sequence[StateUpdate]]
    ) -> RunnableConfig:
        """`bulk_update_state`, awaited (`aupdate_state` comes here too)."""
        saver = self._reader(config)
        thread = str(thread_id(config))
        actor = (await aopened_as(saver, thread)).actor if saver is not None else None
        admitted = _admitted(supersteps, actor)
        return await super().abulk_update_state(self._edit_traced(config, actor), admitted)

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
        asked = self._asked(input, config, kwargs)
        return drive_streaming(self._steps(lambda: asked, config, kwargs))

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator:
        """`stream`, awaited: the same steps, with the event loop free while the call waits.
        Its input is admitted at the first `anext`, as LangGraph's async generator's is."""
        asking = partial(self._asked, input, config, kwargs)
        return adrive_streaming(self._steps(asking, config, kwargs))


async def _each(chunks: list[Any]) -> AsyncIterator:
    """`iter(chunks)` for an async run."""
    for chunk in chunks:
        yield chunk


@contextmanager
def _logged() -> Iterator[None]:
    """A quiet run's failure is logged: the caller's own turn goes on."""
    try:
        yield
    except GraphBubbleUp:
        raise
    except Exception:
        log.exception("finishing the turn a dead run left failed; the new turn goes on")


def _with_metadata(config: RunnableConfig | None, facts: dict[str, Any]) -> RunnableConfig:
    """`config` with `facts` first in its metadata (a trace attribute cut at a length limit
    still names the session and its actor)."""
    given = {k: v for k, v in (config or {}).get("metadata", {}).items() if k not in facts}
    return {**(config or {}), "metadata": {**facts, **given}}


def _thread_key(config: RunnableConfig) -> tuple[str, str]:
    return str(thread_id(config)), str(configurable(config).get("checkpoint_ns", ""))


def _admitted(
    supersteps: Sequence[Sequence[StateUpdate]], actor: str | None
) -> list[list[StateUpdate]]:
    """Every update's values through the boundary (an unnamed human message is the owner's
    only on the owner's thread); nothing is applied if one is refused."""
    owner = actor in ("owner", "internal")
    return [
        [
            update._replace(values=admit_state_update(update.values, owner_thread=owner))
            for update in step
        ]
        for step in supersteps
    ]
