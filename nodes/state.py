"""The checkpointed state of a session, and what callers may send in.

`messages` is the transcript. It uses LangGraph's `DeltaChannel`, so a
checkpoint stores the turn's new messages rather than the whole list again:
checkpoint bytes per turn stay flat however long the session grows (a plain
`add_messages` channel re-serialises the full transcript at every step, which
makes storage grow with the square of the session length). Its reducer is
`add_messages` folded over the batch, followed by `close_interrupted_calls`,
which keeps the invariant that no tool call is ever left dangling before a
later message.

A long session keeps only its live window in `messages`: once compaction's
summary covers older messages, `compact` moves them to the transcript archive
beside the checkpoints (`nodes.protocols.TranscriptArchive`) and `archived`
counts them, so loading, reducing, viewing and saving a turn cost the same at
turn 10,000 as at turn 100. The whole transcript is the archive followed by
the window (`CyreneGraph.transcript`).

`summary` is a `DeltaChannel` too, written when compaction moves and otherwise
stored in no checkpoint (a plain channel would put its few kilobytes into every
checkpoint of the SQLite saver: four a turn).

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
from langchain_core.messages.ai import UsageMetadata
from langgraph.channels.untracked_value import UntrackedValue
from langgraph.graph.message import REMOVE_ALL_MESSAGES, Messages, add_messages

from nodes.compat import DeltaChannel
from nodes.view.compaction import Summary
from nodes.view.transcript import close_interrupted_calls, open_calls_start, turn_number


def merge_transcript(current: list[BaseMessage], writes: Sequence[Messages]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` over a batch, then close dangling calls.

    A human message and a reply or tool result never replace each other when
    they happen to share an id (`kept_apart`): `add_messages` replaces by id,
    so an inbound message under a reply's id would orphan a tool call, and a
    reply under the user's message id would lose what the user said.

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
    start = open_calls_start(current)
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
    """`batch` with each message whose id belongs to a message on the other side of the
    human / not-human line (one stored, or earlier in the batch) moved to a derived id.

    What a person said and what the loop answered never overwrite each other:
    a platform id can collide with a stored reply's, and a provider can answer
    under the id the platform gave the user's message. Re-sending a human
    message under its id still replaces it (that is how a retried message is
    stored once), and a reply rewritten under its id still replaces the reply.
    The derived id (`m1#ai`, `m1#human`, `m1#tool`; suffixed again while the
    other side holds that too) is the same on every replay, so a later
    rewrite of a moved message lands on the moved copy. Only what comes before
    a message counts, so folding writes one by one or all at once moves the same ones.
    """
    held_by_human: dict[str | None, bool] = {
        m.id: isinstance(m, HumanMessage) for m in current if m.id
    }
    """id → whether a human message holds it, as of the message being looked at."""
    moved = []
    for message in batch:
        if isinstance(message, RemoveMessage):
            if message.id == REMOVE_ALL_MESSAGES:
                held_by_human.clear()
            held_by_human.pop(message.id, None)
        elif isinstance(message, BaseMessage) and message.id:
            human = isinstance(message, HumanMessage)
            free_id = message.id
            while held_by_human.get(free_id, human) != human:
                free_id = f"{free_id}#{message.type}"
            if free_id != message.id:
                message = message.model_copy(update={"id": free_id})
            held_by_human[free_id] = human
        moved.append(message)
    return moved


def latest_summary(current: Summary, writes: Sequence[Summary]) -> Summary:
    """DeltaChannel reducer for `summary`: the latest write wins (batching-invariant)."""
    return writes[-1] if writes else current


class ArchiveMark(TypedDict):
    """How much of the transcript lives in the archive, before the live window."""

    messages: int
    """Messages archived: the position of the window's first message in the whole transcript."""
    humans: int
    """Human messages among them (turn numbers count them)."""


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


class TokenUsage(TypedDict):
    """Tokens the session's model calls used, as the providers reported them (LangChain's
    `usage_metadata`, cached input in `input_token_details.cache_read`); written by
    `nodes.policies.token_accounting`. Calls that reported nothing are not in it."""

    turn_id: str | None
    """The turn `calls` and `turn` belong to: the id of its opening message."""
    calls: list[UsageMetadata]
    """That turn's model calls, in order (a retried or fallback call once each)."""
    turn: NotRequired[UsageMetadata]
    """The sum of `calls` (absent when none reported usage)."""
    session: NotRequired[UsageMetadata]
    """The sum over every call of the session."""


class PresenceRecord(TypedDict):
    """Whether the companion answers a group turn, and why (`nodes.policies.presence`)."""

    reply: bool
    reason: str
    heard: str | None
    """Id of the newest message the decision heard: the turn it belongs to."""
    policy: str
    """`LoopConfig.group_reply` when it was made (`"mentioned"` or `"judged"`)."""


class LoopState(TypedDict):
    """Checkpointed per-thread state."""

    messages: Annotated[list[AnyMessage], DeltaChannel(merge_transcript)]
    working_memory: NotRequired[str]
    """Caller-provided working-memory summary, rendered as `工作记忆: …`."""
    mood: NotRequired[Any]
    """What `on_turn_end` returned for the latest finished turn."""
    summary: NotRequired[Annotated[Summary, DeltaChannel(latest_summary, snapshot_frequency=1)]]
    """Compaction's running summary and the last message it covers (the transcript stays whole)."""
    archived: NotRequired[ArchiveMark]
    """The part of the transcript moved to the archive (absent: none)."""
    image_descriptions: NotRequired[dict[str, str]]
    """Vision cache for this session: image hash → description."""
    capacity: NotRequired[dict[str, int]]
    """Awake capacity tiers → the turn number they were last woken or used in."""
    token_usage: NotRequired[TokenUsage]
    """Tokens used per call, per turn and per session (absent until a provider reports any)."""
    pending_extractions: NotRequired[list[PendingExtraction]]
    """Background extractions not yet seen done or lost (see `nodes.extraction`)."""
    presence: NotRequired[PresenceRecord]
    """The latest group turn's decision to answer or stay quiet (group_reply other than always)."""
    model_view: NotRequired[Annotated[list[AnyMessage], UntrackedValue(list)]]
    """The assembled model input of the current round (not checkpointed)."""


def turn_of(state: LoopState) -> int:
    """1-based number of the session's current turn, archived turns included."""
    archived = state.get("archived")
    return turn_number(state["messages"]) + (archived["humans"] if archived else 0)
