"""What a `ReplyJudge` reads (`Hearing`) and returns (`ReplyVerdict`), and the protocol itself.

Plug-in point of group presence (`GroupPresence(reply="judged", judge=...)`):
bring your own judge, no base class needed. The protocol is runtime-checkable, so
`GroupPresence` refuses an object that lacks `judge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from langchain_core.messages import BaseMessage


@dataclass(frozen=True)
class Hearing:
    """What a group chat said since the companion last spoke, as a `ReplyJudge` reads it.

    Built by the loop from the transcript's tail before the model is called.
    Whether the turn mentions the companion is worked out here (`addressed`),
    from the text and the platform's flag only: a display name never counts.
    """

    persona_id: str | None
    """The persona answering in the group (the default one)."""
    names: tuple[str, ...]
    """The persona's name and nicknames, as a mention would spell them."""
    recent: tuple[BaseMessage, ...]
    """The last messages of the conversation (people's and the companion's), oldest first."""
    pending: tuple[BaseMessage, ...]
    """The people's messages since the companion last spoke, oldest first (this turn's last)."""
    speakers: tuple[str, ...]
    """Who spoke in `recent`, first appearance first: display names, `主人` for the owner."""
    addressed: str | None
    """Why the turn addresses the companion ("mentioned 昔涟", "the platform flagged a
    mention"), or None."""
    own_share: float
    """The companion's share of `recent` (0 when it has not spoken there)."""


@dataclass(frozen=True)
class ReplyVerdict:
    """A judge's answer: speak now, or stay quiet; the reason shows in Studio and the stream."""

    reply: bool
    reason: str


@runtime_checkable
class ReplyJudge(Protocol):
    """Decides whether the companion answers a group turn (`GroupPresence(reply="judged")`).

    `ReplyScorer` (offline, the default) and `LLMReplyJudge` (a model with structured
    output) are the loop's own. A judge that blocks (I/O, a model) should say so with
    `blocking = True` (assumed when absent): an async turn then asks it off the event
    loop. A judge that raises is logged and the turn answers.
    """

    def judge(self, hearing: Hearing, /) -> ReplyVerdict:
        """Reply or wait, with a reason."""
        ...
