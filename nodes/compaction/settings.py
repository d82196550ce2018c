"""`Compaction`: the token budget the model view is kept under, and who writes the summary.

On by default (`max_context_tokens="auto"`); `Compaction(max_context_tokens=0)`
turns it off. What it does is `nodes.compaction.policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage
from pydantic import Field, field_validator

from nodes.core.feature import Feature

AUTO_SHARE = 0.5
"""`max_context_tokens="auto"`: the share of the model's input window the view may fill
(the rest is for the memory block, the turn's tool results and the reply)."""
AUTO_FALLBACK = 16_000
"""`max_context_tokens="auto"` for a model whose LangChain profile has no `max_input_tokens`."""
Describe = Callable[[BaseMessage], str]
"""How a compactor names a message's speaker (`nodes.context.attribution.describe_speaker`)."""


@runtime_checkable
class Compactor(Protocol):
    """Folds older messages into a running summary (`StructuralCompactor`, `LLMCompactor`, yours)."""

    def compact(
        self, messages: Sequence[BaseMessage], previous: str | None, budget: int, describe: Describe
    ) -> str:
        """Summarise `messages` (new since `previous`) into at most ~`budget` tokens."""
        ...


class Compaction(Feature):
    """Keep the model view under a token budget; older turns fold into a running summary
    and move to the transcript archive, so a long session costs the same per turn.

    Example:
        >>> LoopConfig(model=model, features=[Compaction(max_context_tokens=4000, compactor=LLMCompactor(model))])
    """

    max_context_tokens: int | Literal["auto"] = Field(
        default="auto",
        description='compaction budget in tokens: `"auto"` takes half the answering model\'s input window from its LangChain profile (`max_input_tokens`), or 16,000 when the profile has none; `0` = off. Older messages the summary covers move to the transcript archive, so a long session costs the same per turn',
    )
    compactor: Compactor | None = Field(
        default=None,
        description="structural (no model call) when unset; `LLMCompactor(model)` writes incremental summaries",
    )

    @field_validator("max_context_tokens")
    @classmethod
    def _budget_not_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("max_context_tokens: must be 0 (off), a positive number or 'auto'")
        return value

    @property
    def on(self) -> bool:
        return self.max_context_tokens != 0

    def budget_for(self, model: Any) -> int:
        """The token budget the view is kept under for `model` (0 = off)."""
        if self.max_context_tokens != "auto":
            return self.max_context_tokens
        window = (getattr(model, "profile", None) or {}).get("max_input_tokens")
        return int(window * AUTO_SHARE) if isinstance(window, int) and window > 0 else AUTO_FALLBACK
