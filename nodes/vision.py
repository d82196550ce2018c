"""`resolve_vision`: images in the user's message, for a model that may not see them.

Seed `Vision`: with no describer configured, images pass through untouched.
With one, images are kept when the main model takes images (the
`model_accepts_images` flag, else the model's LangChain profile) and otherwise
folded into a text description — described once per session per image hash.
The message keeps a reference (hash, URL or size, MIME type) in
`response_metadata["cyrene"]["images"]`. Oversized, undecodable or
undescribable images become a clear text placeholder; nothing raises.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from memory.transcript import message_text
from nodes.loop import Loop
from nodes.transcript import annotated, turn_start

log = logging.getLogger("cyrene.vision")

DESCRIBE_PROMPT = "请用一两句话客观描述这张图片的内容，包括其中的文字。"
MAX_IMAGE_BYTES = 10 * 1024 * 1024
Describer = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class ImageRef:
    """What is kept of an image once its pixels are folded into text."""

    hash: str
    url: str | None = None
    size: int | None = None
    mime_type: str | None = None


class ImageError(ValueError):
    """An image that cannot be described; its message is the placeholder reason."""


def is_image_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in ("image", "image_url")


def _data_url(url: str) -> tuple[str | None, str | None]:
    """(mime type, base64 payload) of a data: URL, or (None, None)."""
    if not url.startswith("data:") or "," not in url:
        return None, None
    header, payload = url[5:].split(",", 1)
    return header.split(";")[0] or None, payload


def image_ref(block: dict[str, Any], max_bytes: int = MAX_IMAGE_BYTES) -> ImageRef:
    """Hash and describe-able facts of an image block (standard, legacy or OpenAI shape)."""
    if block.get("type") == "image_url":
        inner = block.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
    else:
        url = block.get("url")
    mime = block.get("mime_type")
    data = block.get("base64") or block.get("data")
    if url and url.startswith("data:"):
        mime, data = _data_url(url)
        url = None
    if data:
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError("图片数据无法解码") from exc
        if len(raw) > max_bytes:
            raise ImageError(f"图片过大（{len(raw)} 字节，上限 {max_bytes} 字节）")
        return ImageRef(hashlib.sha256(raw).hexdigest(), None, len(raw), mime)
    if url:
        return ImageRef(hashlib.sha256(url.encode()).hexdigest(), url, None, mime)
    raise ImageError("图片既没有数据也没有地址")


def describer_for(vision: Any) -> Describer:
    """A describe(block) function from a vision chat model or any callable."""
    if isinstance(vision, BaseChatModel):
        return lambda block: message_text(
            vision.invoke([HumanMessage([{"type": "text", "text": DESCRIBE_PROMPT}, block])])
        )
    return vision


def placeholder(ref: ImageRef | None, text: str) -> dict[str, str]:
    tag = f"图片 {ref.hash[:12]}" if ref else "图片"
    return {"type": "text", "text": f"[{tag}：{text}]"}


def fold_images(
    message: HumanMessage, describe: Describer, cache: dict[str, str], max_bytes: int
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
    flag = loop.config.model_accepts_images
    if flag is not None:
        return flag
    profile = getattr(loop.default_model, "profile", None) or {}
    return bool(profile.get("image_inputs"))


def make_resolve_vision(loop: Loop):
    describe = describer_for(loop.config.vision) if loop.config.vision is not None else None
    keep = describe is None or model_accepts_images(loop)

    def resolve_vision(state: dict, config: RunnableConfig) -> dict:
        """Fold this turn's images into text descriptions when the model can't see them."""
        if keep:
            return {}
        messages: list[BaseMessage] = state["messages"]
        cache = dict(state.get("image_descriptions") or {})
        updated: list[BaseMessage] = []
        for message in messages[turn_start(messages) :]:
            if (
                isinstance(message, HumanMessage)
                and isinstance(message.content, list)
                and any(is_image_block(b) for b in message.content)
            ):
                folded, learned = fold_images(message, describe, cache, loop.config.max_image_bytes)
                cache.update(learned)
                updated.append(folded)
        if not updated:
            return {}
        return {"messages": updated, "image_descriptions": cache}

    return resolve_vision
