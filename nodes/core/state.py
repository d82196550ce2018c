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
beside the checkpoints (`nodes.core.protocols.TranscriptArchive`) and `archived`
counts them, so loading, reducing, viewing and saving a turn cost the same at
turn 10,000 as at turn 100. The whole transcript is the archive followed by
the window (`CyreneGraph.transcript`).

`summary` is a `DeltaChannel` too, written when compaction moves and otherwise
stored in no checkpoint (a plain channel would put its few kilobytes into every
checkpoint of the SQLite saver: four a turn).

`opened_as` is what the thread was opened as (its actor), written by the loop with
the thread's first turn and never again: its reducer keeps the first value, and no
door takes it from a caller (`nodes.core.env.bound_env` reads it for every later run).

A feature's own keys (a group turn's `presence` decision, awake capacity tiers,
token usage, pending extractions, …) are declared in its folder
(`nodes.core.feature.Feature.state_schema`).

`model_view` is the per-round assembled model input. It is an
`UntrackedValue`: visible to the next node and in Studio's updates, but never
checkpointed and never part of the transcript.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, NotRequired, TypedDict

from langchain_core.messages import AnyMessage, BaseMessage
from langgraph.channels.untracked_value import UntrackedValue

from nodes.core.reducers import latest_summary, merge_transcript
from nodes.kernel.choices import Actor
from nodes.kernel.compat import DeltaChannel
from nodes.kernel.transcript import turn_number


class Summary(TypedDict):
    """What the compactor has folded so far."""

    text: str
    upto: str
    """Id of the last transcript message the summary covers."""
    turn: NotRequired[int]
    """The turn it was last written in (see `nodes.compaction.policy.SUMMARY_REFRESH_TURNS`)."""
    left_out: NotRequired[list[str]]
    """The session's forgotten turns (the ids of their openings) when it was written: none
    of their words are in it (`nodes.compaction.rewrite`). Absent: not known."""


def uncovered_start(messages: Sequence[BaseMessage], summary: Summary | None) -> int:
    """Index of the first message the summary does not cover (0 without a summary)."""
    if not summary:
        return 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].id == summary["upto"]:
            return i + 1
    return 0  # the covered message is gone (edited transcript): summarise afresh


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


class OpenedAs(TypedDict):
    """What a thread was opened as: fixed by its first turn."""

    actor: Actor


def first_opened(current: OpenedAs, new: OpenedAs) -> OpenedAs:
    """The reducer of `opened_as`: the first value stays (a thread is what it was opened as)."""
    return current or new


OPENED_AS = "opened_as"


class RunInput(TurnInput, total=False):
    """The graph's input: what a caller sends (`TurnInput`, all the boundary admits), plus
    what the loop itself adds to a thread's first run (`graph.runs`)."""

    opened_as: OpenedAs


class LoopState(TypedDict):
    """Checkpointed per-thread state: the transcript and what every floor reads of it.

    Each feature adds its own keys (its `Feature.state_schema`: `presence`,
    `capacity`, `token_usage`, …); the graph's state is this with every feature's keys
    and every middleware's (`graph.builder`).
    """

    messages: Annotated[list[AnyMessage], DeltaChannel(merge_transcript)]
    opened_as: NotRequired[Annotated[OpenedAs, first_opened]]
    """The actor the thread was opened as (written once, with its first turn)."""
    working_memory: NotRequired[str]
    """Caller-provided working-memory summary, rendered as `工作记忆: …`."""
    summary: NotRequired[Annotated[Summary, DeltaChannel(latest_summary, snapshot_frequency=1)]]
    """Compaction's running summary and the last message it covers (the transcript stays whole)."""
    archived: NotRequired[ArchiveMark]
    """The part of the transcript moved to the archive (absent: none)."""
    model_view: NotRequired[Annotated[list[AnyMessage], UntrackedValue(list)]]
    """The assembled model input of the current round (not checkpointed)."""


def turn_of(state: LoopState) -> int:
    """1-based number of the session's current turn, archived turns included."""
    archived = state.get("archived")
    return turn_number(state["messages"]) + (archived["humans"] if archived else 0)
