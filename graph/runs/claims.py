"""What a run runs once it holds its session: its own turn, a resume, or nothing.

A run that waited for its session may find its message already answered (a script
re-sent with the same ids), taken by a turn that died (recovered: run again, resumed, or
left as answered), or a resume with nothing to resume; and before a new turn, a dead run's
saved final reply is finished first. These are the decisions between holding the session
and running the turn (`graph.runs.compiled.CyreneGraph._steps`), kept apart from
admitting the run (`graph.runs.opening`) and from the steps' order itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from graph.runs.protocol import RunningGraph
from graph.runs.traces import traced
from graph.sessions.gate import answered_chunks, merged_input
from graph.sessions.inbox import Claim
from nodes.extraction.node import turn_env
from nodes.kernel.run_config import thread_id
from nodes.kernel.steps import Either, Steps, Stream

MESSAGES = "messages"
"""The transcript's channel."""
ANSWERED = object()
"""A recovered or re-sent message that is stored and whose turn is complete: nothing to run."""


def final_reply(write: tuple[str, str, Any]) -> bool:
    """Whether a saved write `(task, channel, value)` stores a reply that asks for no tool."""
    _, channel, value = write
    written = value if isinstance(value, list) else [value]
    return channel == MESSAGES and any(
        isinstance(m, AIMessage) and not m.tool_calls for m in written
    )


class NothingToResumeError(ValueError):
    """`invoke(None, thread)` on a thread with no interrupted turn."""


def nothing_to_resume(config: RunnableConfig | None) -> NothingToResumeError:
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


def finish_dead_step(
    graph: RunningGraph, config: RunnableConfig | None, saved: CheckpointTuple | None
) -> Steps:
    """Before a new turn: finish the turn whose run died after its final reply was saved
    and before the checkpoint after it was. A new run starts from that checkpoint and
    would drop the reply: never stored, its turn never extracted. So the dead turn is
    resumed first, as it was opened, quietly; what is left of it calls no model. A turn
    that died amid its tools is not resumed: the new message moves on, and its dangling
    calls are closed (`nodes.core.reducers`). `saved`: the thread's latest checkpoint."""
    if saved is None or not any(final_reply(w) for w in saved.pending_writes or ()):
        return
    turn = turn_env((yield from graph._state(graph._at(config, None))).values.get("messages", []))
    if turn is None:  # saved before turns recorded their env: who spoke is not known
        return
    kwargs = graph._run_kwargs(config, {"context": turn})
    turn_config = traced(graph.trace_facts, config, turn)
    yield Either(graph._drain, graph._adrain, (None, turn_config, kwargs))


def resumable(graph: RunningGraph, config: RunnableConfig | None) -> Steps:
    # A crash can land after a task's writes were saved but before the next
    # checkpoint was: `next` is then empty, yet LangGraph resumes from the writes.
    saved = yield graph._saved(config or {})
    if saved is None:
        return False
    return bool(saved.pending_writes or (yield from graph._state(config)).next)


def claimed_input(
    graph: RunningGraph, claim: Claim, input: Any, config: RunnableConfig | None, resendable: bool
) -> Steps:
    """What the claimed turn runs; `resendable`: the caller gave every message its id, so
    they may be stored already (messages given new ids never are: no state is read)."""
    if claim.recovering:
        messages = (yield from graph._state(graph._at(config, None))).values.get("messages", [])
        can_resume = yield from resumable(graph, config)
        return recovered_input(claim, input, {m.id for m in messages}, can_resume)
    if input is None and not (yield from resumable(graph, config)):
        raise nothing_to_resume(config)
    if not isinstance(input, dict):
        return input
    if not claim.merged and resendable and (yield from answered_already(graph, input, config)):
        return ANSWERED
    return merged_input(claim, input)


def answered_already(graph: RunningGraph, input: dict, config: RunnableConfig | None) -> Steps:
    """Whether every message of `input` is already in the thread and its turn is over
    (answered, or a group turn that stayed quiet): a script run twice with `id="m1"`.
    Running it again would answer one message twice. A message stored by a turn that
    failed is run again: the caller is retrying it."""
    stored = (yield from graph._state(graph._at(config, None))).values.get(MESSAGES, [])
    ids = {m.id for m in stored if isinstance(m, HumanMessage)}  # a reply's may collide
    sent = input.get(MESSAGES) or []
    if not sent or not all(m.id in ids for m in sent):
        return False
    return not (yield from resumable(graph, config))


def answer(
    graph: RunningGraph, checkpoint_id: str | None, config: RunnableConfig | None, kwargs: dict
) -> Steps:
    """The state another caller's turn answered this call with, streamed as this run's
    `stream_mode` shapes it."""
    values = (yield from graph._state(graph._at(config, checkpoint_id))).values
    yield Stream(iter, _each, (answered_chunks(values, kwargs, graph.stream_mode),))


async def _each(chunks: list[Any]) -> AsyncIterator:
    """`iter(chunks)` for an async run."""
    for chunk in chunks:
        yield chunk
