"""`TurnEnd`: the caller's hook on every answered turn, and the mood it leaves in state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NotRequired

from pydantic import Field

from nodes.core.feature import Feature
from nodes.core.state import LoopState


class TurnEndState(LoopState):
    """The key the turn-end hook keeps in a session."""

    mood: NotRequired[Any]
    """What the hook returned for the latest finished turn."""


class TurnEnd(Feature):
    """`finish_turn` reports each answered turn to `hook`; what it returns (a mood) goes on
    the final reply and into state.

    Example:
        >>> LoopConfig(model=model, features=[TurnEnd(hook=lambda user, reply, persona: "开心")])
    """

    state_schema = TurnEndState

    hook: Callable[[str, str, str | None], Any] | None = Field(
        default=None, description="`(user_text, assistant_text, persona_id) -> mood`"
    )

    @property
    def on(self) -> bool:
        return self.hook is not None
