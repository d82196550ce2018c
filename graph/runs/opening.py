"""Admitting a run, and binding it to what its thread and turn were opened as.

Before a run waits for its session it is admitted at the boundary (bad input fails at
once), bound to the actor its thread was opened as and, continuing a turn, to that
turn's env (`nodes.core.env.bound_env`: a resume of a group turn is that group's), and a
`Command` that would start a session is refused. A new turn's input then gets the
records a resume and extraction read back. These are the opening steps of
`graph.runs.compiled.CyreneGraph._steps`, kept apart from what runs once the session is
held (`graph.runs.claims`); edits of state from outside a turn are admitted here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.types import Command, StateUpdate

from graph.runs.protocol import RunningGraph
from graph.sessions.binding import (
    Asked,
    Bound,
    aopened_as,
    opened_actor,
    opened_as,
    refuse_unrecorded_restricted,
)
from graph.sessions.gate import with_ids
from nodes.boundary.admission import admit, admit_state_update
from nodes.core.env import SessionEnv, bound_env
from nodes.core.state import OPENED_AS, OpenedAs
from nodes.extraction.node import opened_turn, turn_env
from nodes.kernel.compat import checkpointer_of, inside_parent_run, parent_context
from nodes.kernel.run_config import thread_id
from nodes.kernel.steps import Either, Steps


def asked_run(
    graph: RunningGraph, input: Any, config: RunnableConfig | None, kwargs: dict
) -> Asked:
    """The run as its caller asked for it, admitted (bad input fails here, at once). A
    run as a parent graph's subgraph, given no context of its own, has its parent's
    (when that is a SessionEnv or a dict of one: a group parent stays a group)."""
    context = kwargs.get("context")
    if context is None and inside_parent_run(config):
        inherited = parent_context(config)
        context = inherited if isinstance(inherited, SessionEnv | Mapping) else None
    admitted, context = admit_run(graph, input, config, context)
    return Asked(input, admitted, context)


def admit_run(
    graph: RunningGraph, input: Any, config: RunnableConfig | None, context: Any
) -> tuple[Any, Any]:
    now = graph.clock() if graph.clock is not None else None
    return admit(input, config, context, max_image_bytes=graph.max_image_bytes, now=now)


def opening(graph: RunningGraph, input: Any, bound: Bound) -> Any:
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
    env = bound.env.model_copy(update={"persona_id": graph.persona_of(bound.env)})
    opened = opened_turn(with_ids(input), env, extracts=graph.records_turns)
    return {**opened, OPENED_AS: OpenedAs(actor=env.actor)} if bound.opens_thread else opened


def reader(graph: RunningGraph, config: RunnableConfig | None) -> BaseCheckpointSaver | None:
    """The saver holding the thread's checkpoints: the graph's, Studio's, or none."""
    return graph._saver if graph._saves_itself else checkpointer_of(config)


def bind(graph: RunningGraph, asked: Asked, config: RunnableConfig | None) -> Steps:
    """The run under what its thread (and, continuing a turn, that turn) was opened as
    (`nodes.core.env.bound_env`), its input admitted again if that changes the rules."""
    saver = reader(graph, config)
    if saver is None or thread_id(config) is None:  # nothing is kept: nothing to bind to
        return Bound(asked.context or SessionEnv(), asked.input, False)
    opened = yield from thread_opened_as(saver, config)  # the thread's, never a fork's
    actor, turn = opened.actor, None
    if not isinstance(asked.input, dict):  # a resume or a Command continues its turn
        values = (yield from graph._state(config)).values
        turn = turn_env(values.get("messages", []))
        if turn is None and actor is None:
            refuse_unrecorded_restricted(values, asked.context, config)
    env = bound_env(
        asked.context,
        thread_actor=actor,
        turn=turn,
        persona_of=graph.persona_of,
        thread=thread_id(config),
    )
    claimed = asked.context or SessionEnv()
    same_rules = (env.restricted, env.mentioned) == (claimed.restricted, claimed.mentioned)
    input = asked.input if same_rules else admit_run(graph, asked.raw, config, env)[0]
    return Bound(env, input, not opened.recorded or (actor is None and turn is None))


def thread_opened_as(saver: BaseCheckpointSaver, config: RunnableConfig | None) -> Steps:
    """The actor the run's thread was opened as (`graph.sessions.binding.opened_as`)."""
    thread = str(thread_id(config))
    return (yield Either(opened_as, aopened_as, (saver, thread)))


def still_unbound(
    graph: RunningGraph,
    env: SessionEnv,
    config: RunnableConfig | None,
    saved: CheckpointTuple | None,
) -> Steps:
    """Refuse a first turn whose thread another caller opened as another actor first
    (`saved`: the thread's latest checkpoint, read with the session held)."""
    actor = opened_actor(saved)
    if actor is None and saved is not None:  # a fork from before the record: look back
        actor = (yield from thread_opened_as(graph._saver, config)).actor
    if actor is not None and actor != env.actor:
        bound_env(
            env,
            thread_actor=actor,
            turn=None,
            persona_of=graph.persona_of,
            thread=thread_id(config),
        )


def check_command(graph: RunningGraph, command: Command, config: RunnableConfig | None) -> Steps:
    """A `Command` continues a session: refused when no human message would be in it
    (a resume or `goto` would call the model with nothing said)."""
    update = command.update if isinstance(command.update, dict) else {}
    if any(isinstance(m, HumanMessage) for m in update.get("messages") or []):
        return
    stored = (yield from graph._state(graph._at(config, None))).values.get("messages", [])
    if not any(isinstance(m, HumanMessage) for m in stored):
        raise ValueError(
            f"thread {thread_id(config)!r} has no human message: a Command continues a "
            "session and cannot start one; send a message"
        )


def admitted_updates(
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
