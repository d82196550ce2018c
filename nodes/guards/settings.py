"""`Guards`: the checks on what the user sends and what the model answers, and the refusal."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from nodes.core.feature import Feature
from nodes.guards.checks import Guard

DEFAULT_REFUSAL = "抱歉，这个话题我不能继续。"


class Guards(Feature):
    """Request and response guards; a block ends the turn with `refusal_text`.

    Example:
        >>> LoopConfig(model=model, features=[Guards(checks=[KeywordGuard(["密码"])])])
    """

    checks: Sequence[Guard] = Field(
        default=(),
        description="`Guard`s (`check_request` / `check_response`); a block ends the turn with `refusal_text`",
    )
    refusal_text: str = Field(default=DEFAULT_REFUSAL, description="what a blocked turn answers")

    @property
    def on(self) -> bool:
        return bool(self.checks)
