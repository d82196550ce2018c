"""`resolve_vision`: images in the user's message, for a model that may not see them.

With no describer configured, images pass through untouched.
With one, images are kept when the main model takes images (the
`model_accepts_images` flag, else the model's LangChain profile) and otherwise
folded into a text description — described once per session per image hash.
The message keeps a reference (hash, URL or size, MIME type) in
`response_metadata["cyrene"]["images"]`. Oversized, undecodable or
undescribable images become a clear text placeholder; nothing raises.
Images arrive already normalised by the boundary (`nodes.kernel.images`), so any
block kept here is one every provider renders.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig

from nodes.core.loop import Loop
from nodes.core.state import LoopState
from nodes.kernel.compat import sync_node
from nodes.kernel.images import ImageError, image_ref, is_image_block, placeholder
from nodes.kernel.messages import message_text
from nodes.kernel.transcript import annotated, unanswered_start
from nodes.token_accounting.aside import add_aside, measuring
from nodes.token_accounting.state import TokenUsageState
from nodes.vision.settings import ImageDescriber, Vision, VisionState

log = logging.getLogger("cyrene.vision")

DESCRIBE_PROMPT = "请用一两句话客观描述这张图片的内容，包括其中的文字。"


def describer_for(vision: BaseChatModel | ImageDescriber) -> ImageDescriber:
    """A describe(block) function from a vision chat model or any callable."""
    if isinstance(vision, BaseChatModel):
        return lambda block: message_text(
            vision.invoke([HumanMessage([{"type": "text", "text": DESCRIBE_PROMPT}, block])])
        )
    return vision


def fold_images(
    message: HumanMessage, describe: ImageDescriber, cache: dict[str, str], max_bytes: int
) -> tuple[HumanMessage, dict[str, str]]:
    """The message with images replaced by descriptions, and the new cache entries."""
    content: list[Any] = []
    refs: list[dict[str, Any]] = []
    learned: dict[str, str] = {}
    for block in message.content:
        if not is_image_block(block):
            content.append(block)
            continue
        ref = None
        try:
            ref = image_ref(block, max_bytes)
            known = cache.get(ref.hash) or learned.get(ref.hash)
            if known is None:
                known = describe(block).strip() or "（识别结果为空）"
                learned[ref.hash] = known
            content.append(placeholder(ref, "描述：" + known))
        except ImageError as exc:
            content.append(placeholder(ref, f"{exc}，未能识别"))
        except Exception as exc:
            log.exception("image describer failed")
            content.append(placeholder(ref, f"识别失败（{exc.__class__.__name__}）"))
        refs.append(asdict(ref) if ref else {"hash": None})
    folded = annotated(message.model_copy(update={"content": content}), images=refs)
    return folded, learned


def model_accepts_images(loop: Loop) -> bool:
    flag = loop.feature(Vision).model_accepts_images
    if flag is not None:
        return flag
    profile = getattr(loop.default_model, "profile", None) or {}
    return bool(profile.get("image_inputs"))


def make_resolve_vision(loop: Loop) -> Runnable[Any, Any]:
    settings = loop.feature(Vision)
    vision = settings.describer
    # Images pass through when nothing describes them or the model sees them itself.
    describe = None if vision is None or model_accepts_images(loop) else describer_for(vision)

    def resolve_vision(state: LoopState, config: RunnableConfig) -> dict[str, Any]:
        """Fold the images of the messages since the last reply (this turn's, a merged
        burst's, a group's quiet turns') into text when the model can't see them."""
        if describe is None:
            return {}
        messages = state["messages"]
        cache = dict(cast(VisionState, state).get("image_descriptions") or {})
        updated: list[BaseMessage] = []
        with measuring() as spent:  # a describer model's tokens count as vision's
            for message in messages[unanswered_start(messages) :]:
                if (
                    isinstance(message, HumanMessage)
                    and isinstance(message.content, list)
                    and any(is_image_block(b) for b in message.content)
                ):
                    folded, learned = fold_images(
                        message, describe, cache, settings.max_image_bytes
                    )
                    cache.update(learned)
                    updated.append(folded)
        if not updated:
            return {}
        update: dict[str, Any] = {"messages": updated, "image_descriptions": cache}
        add_aside(update, cast(TokenUsageState, state).get("token_usage"), "vision", spent())
        return update

    return sync_node(resolve_vision, "resolve_vision")
