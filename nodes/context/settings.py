"""`ModelView`: how each round's view is laid out and encoded, what it holds, and whether
it is a step of its own.

What the view holds and in which order is `nodes.context.assemble`; the layouts
are `nodes.context.layout`, the encodings `nodes.context.encoding`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from nodes.context.encoding import ENCODING_BY_PROVIDER, Encoding
from nodes.context.layout import Layout
from nodes.core.feature import Feature
from nodes.kernel.providers import Provider


class ModelView(Feature):
    """The model's view of the conversation, assembled fresh every round.

    Example:
        >>> LoopConfig(model=model, features=[ModelView(layout="cache", memory_k=4)])
    """

    layout: Layout = Field(
        default="round_first",
        description='`"round_first"`: the blocks of the round first (instructions, time, working memory, memories, summary, role declaration, conversation); `"cache"`: what stays the same between rounds first (the instructions of every persona, the rules of the notes, summary, conversation), who answers now, time, working memory and memories at the end, with Anthropic `cache_control` breakpoints, so providers can reuse the cached prefix across persona switches and compactions (docs/providers.md "What the model sees")',
    )
    attribution_encoding: Literal["auto", "inline", "leading"] = Field(
        default="auto",
        description='`"inline"` (each attribution note a system message in place: OpenAI-style providers) or `"leading"` (one leading system message with a note index: single-system-message providers); `"auto"` picks per provider',
    )
    memory_k: int = Field(default=8, gt=0, description="memories per block")
    transform: Callable[[list[Any], int], list[Any]] | None = Field(
        default=None,
        description="`(messages, round) -> messages`, last step of every view",
    )
    own_step: bool = Field(
        default=False,
        description="run `compact` and `assemble_context` as steps of their own, so each compaction and each round's model view is a node's update in Studio and `stream_mode=\"updates\"` (more checkpoints per round); off, `call_model` compacts and assembles the view itself",
    )

    def encoding_for(self, provider: Provider) -> Encoding:
        """The configured attribution encoding, or the one `provider` needs."""
        if self.attribution_encoding != "auto":
            return self.attribution_encoding
        return ENCODING_BY_PROVIDER[provider]
