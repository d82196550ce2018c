"""`Fallbacks`: the chat models tried, once each, after the persona's model failed for good."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from nodes.core.config import ModelLike
from nodes.core.feature import Feature


class Fallbacks(Feature):
    """Models tried in order, once each, after the persona's model failed and its retries
    (`LoopConfig.retry`) are spent.

    Example:
        >>> LoopConfig(model="openai:gpt-4o-mini", features=[Fallbacks(models=["anthropic:claude-haiku-4-5"])])
    """

    models: Sequence[ModelLike] = Field(
        default=(),
        description='chat models or `"provider:model"` strings tried in order, once each, after the persona\'s model failed and its retries are spent',
    )
