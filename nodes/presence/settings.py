"""`GroupPresence`: which group-chat turns the companion answers, and what a decision leaves in state.

`reply="always"` (the default) answers every group turn and adds nothing to the
loop; `"mentioned"` and `"judged"` decide first (`nodes.presence.policy`).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pydantic import Field, model_validator

from nodes.core.feature import Feature
from nodes.core.state import LoopState
from nodes.presence.choices import GroupReply
from nodes.presence.hearing import ReplyJudge


class PresenceRecord(TypedDict):
    """Whether the companion answers a group turn, and why (`nodes.presence.policy`)."""

    reply: bool
    reason: str
    heard: str | None
    """Id of the newest message the decision heard: the turn it belongs to."""
    policy: str
    """`GroupPresence.reply` when it was made (`"mentioned"` or `"judged"`)."""


class PresenceState(LoopState):
    """The key group presence keeps in a session."""

    presence: NotRequired[PresenceRecord]
    """The latest group turn's decision to answer or stay quiet (`reply` other than "always")."""


class GroupPresence(Feature):
    """Which group-chat turns the companion answers; owner and stranger chats always answer.

    Example:
        >>> LoopConfig(model=model, features=[GroupPresence(reply="mentioned")])
    """

    state_schema = PresenceState

    reply: GroupReply = Field(
        default="always",
        description='`"always"` (every turn); `"mentioned"`: a message names the persona or a nickname, or the platform says so (`SessionEnv(mentioned=True)`); `"judged"`: `judge` decides. A quiet turn stores the message and calls no model',
    )
    judge: ReplyJudge | None = Field(
        default=None,
        description='with `reply="judged"`: a `ReplyJudge` (`ReplyScorer()`, offline, when unset; `LLMReplyJudge(model)`)',
    )

    @model_validator(mode="after")
    def _judge_only_when_judged(self) -> GroupPresence:
        if self.judge is not None and self.reply != "judged":
            raise ValueError(f"judge: only used with reply='judged' (it is {self.reply!r})")
        return self

    @property
    def decides(self) -> bool:
        """Whether a group turn is decided before anything else runs (not under "always")."""
        return self.reply != "always"
