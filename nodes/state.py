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

from langchain_core.messages import AnyMessage, BaseMessage
from langgraph.channels.untracked_value import UntrackedValue
from langgraph.graph.message import Messages, add_messages

from nodes.compaction import Summary
from nodes.compat import DeltaChannel
from nodes.transcript import close_interrupted_calls, kept_apart


def merge_transcript(current: list[BaseMessage], writes: Sequence[Messages]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` over a batch, then close dangling calls.

    A human message never replaces a message of another kind that happens to
    carry its id (`kept_apart`): `add_messages` replaces by id, and an inbound
    message whose id collides with a reply or a tool result would otherwise
    overwrite it and orphan a tool call.

    Both steps depend only on the resulting list, so the reducer is
    batching-invariant as `DeltaChannel` requires.
    """
    # One `add_messages` over the whole batch: it applies the writes in order, as
    # one call per write would, and a replay after a snapshot folds ~100 writes.
    batch = [m for write in writes for m in (write if isinstance(write, list) else [write])]
    merged = add_messages(cast(Messages, current), cast(Messages, kept_apart(current, batch)))
    return close_interrupted_calls(cast(list[BaseMessage], merged))


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
