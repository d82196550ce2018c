"""The checkpointed state of a session, and what callers may send in.

`messages` is the transcript. It uses LangGraph's `DeltaChannel`, so a
checkpoint stores the turn's new messages rather than the whole list again:
checkpoint bytes per turn stay flat however long the session grows (a plain
`add_messages` channel re-serialises the full transcript at every step, which
makes storage grow with the square of the session length). Its reducer is
`add_messages` folded over the batch, followed by `close_interrupted_calls`,
which keeps the invariant that no tool call is ever left dangling before a
later message.

`model_view` is the per-round assembled model input. It is an
`UntrackedValue`: visible to the next node and in Studio's updates, but never
checkpointed and never part of the transcript.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, NotRequired, TypedDict, cast

from langchain_core.messages import (
    AnyMessage,
    BaseMessage,
    BaseMessageChunk,
    HumanMessage,
    RemoveMessage,
)
from langgraph.channels.untracked_value import UntrackedValue
from langgraph.graph.message import REMOVE_ALL_MESSAGES, Messages, add_messages

from nodes.compaction import Summary
from nodes.compat import DeltaChannel
from nodes.transcript import close_interrupted_calls, last_reply_index

COLLIDED_SUFFIX = "#human"
"""Appended to an inbound message id that a reply or tool result already carries."""


def merge_transcript(current: list[BaseMessage], writes: Sequence[Messages]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` over a batch, then close dangling calls.

    A human message never replaces a message of another kind that happens to
    carry its id (`kept_apart`): `add_messages` replaces by id, and an inbound
    message whose id collides with a reply or a tool result would otherwise
    overwrite it and orphan a tool call.

    Both steps depend only on the resulting list, so the reducer is
    batching-invariant as `DeltaChannel` requires. It runs on every step and
    every load, so the usual step (new messages appended) costs one pass over
    the ids and a look at the tail, not `add_messages`' passes over the list.
    """
    batch: list[Any] = [
        m for write in writes for m in (write if isinstance(write, list) else [write])
    ]
    if only_new_messages(current, batch):
        merged: list[BaseMessage] = [*current, *batch]  # what `add_messages` would return
    else:
        # One `add_messages` over the whole batch: it applies the writes in order,
        # as one call per write would.
        merged = cast(
            list[BaseMessage],
            add_messages(cast(Messages, current), cast(Messages, kept_apart(current, batch))),
        )
        if merged[: len(current)] != current:  # a write replaced or removed a stored message
            return close_interrupted_calls(merged)
    # `current` is already closed, so only the calls of its last reply can be left
    # open: closing starts there.
    start = last_reply_index(current)
    tail = merged[start:]
    closed = close_interrupted_calls(tail)
    return merged if closed is tail else [*merged[:start], *closed]


def only_new_messages(current: Sequence[BaseMessage], batch: Sequence[Any]) -> bool:
    """Every write is a whole message (no chunk, removal or dict) with an id that neither
    the transcript nor an earlier write holds: `add_messages` would only append."""
    ids = set()
    for message in batch:
        if (
            not isinstance(message, BaseMessage)
            or isinstance(message, BaseMessageChunk | RemoveMessage)
            or not message.id
            or message.id in ids
        ):
            return False
        ids.add(message.id)
    return ids.isdisjoint([m.id for m in current])


def kept_apart(current: Sequence[BaseMessage], batch: list[Any]) -> list[Any]:
    """`batch` with each human message whose id belongs to another kind of message re-id'd
    (one stored, or earlier in the batch).

    Re-sending a human message under its id still replaces it (that is how a
    retried message is stored once); only a collision across kinds is moved
    to a derived id, the same on every replay. Only what comes before a message
    counts, so folding writes one by one or all at once moves the same ones.
    """
    if not any(isinstance(m, HumanMessage) and m.id for m in batch):
        return batch
    taken = {m.id for m in current if not isinstance(m, HumanMessage)}
    moved = []
    for message in batch:
        if isinstance(message, HumanMessage):
            if message.id in taken:
                message = message.model_copy(update={"id": f"{message.id}{COLLIDED_SUFFIX}"})
        elif isinstance(message, RemoveMessage):
            if message.id == REMOVE_ALL_MESSAGES:
                taken.clear()
            taken.discard(message.id)
        elif isinstance(message, BaseMessage):
            taken.add(message.id)
        moved.append(message)
    return moved


class TurnInput(TypedDict, total=False):
    """What a caller sends to start a turn."""

    messages: list[AnyMessage]
    working_memory: str


class PendingExtraction(TypedDict):
    """A turn's background extraction, recorded in the checkpoint before the turn returns.

    Enough to run it again after a crash: the transcript is in the same
    checkpoint, so the snapshot is every visible message up to `boundary`.
    """

    key: str
    """Identity of the extraction (thread + boundary); the ledger's record id."""
    boundary: str
    """Id of the turn's last message: the snapshot ends there."""
    session_id: str | None
    """Provenance stamped on the memories: the run's session."""
    message_id: str | None
    """Provenance stamped on the memories: the turn's inbound message."""
    persona_id: str | None
    """The persona that produced the turn (persona-scope memories go there)."""


class LoopState(TypedDict):
    """Checkpointed per-thread state."""

    messages: Annotated[list[AnyMessage], DeltaChannel(merge_transcript)]
    working_memory: NotRequired[str]
    """Caller-provided working-memory summary, rendered as `工作记忆: …`."""
    mood: NotRequired[Any]
    """What `on_turn_end` returned for the latest finished turn."""
    summary: NotRequired[Summary]
    """Compaction's running summary and the last message it covers (the transcript stays whole)."""
    image_descriptions: NotRequired[dict[str, str]]
    """Vision cache for this session: image hash → description."""
    capacity: NotRequired[dict[str, int]]
    """Awake capacity tiers → the turn number they were last woken or used in."""
    pending_extractions: NotRequired[list[PendingExtraction]]
    """Background extractions not yet seen done or lost (see `nodes.extraction`)."""
    model_view: NotRequired[Annotated[list[AnyMessage], UntrackedValue(list)]]
    """The assembled model input of the current round (not checkpointed)."""
