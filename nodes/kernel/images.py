"""Image content blocks: one parser for every shape we take, and one normal form.

Callers send images as LangChain's standard block (`base64`/`url` +
`mime_type`), its older `data` spelling, OpenAI's `image_url` (a string or
`{"url": …}`, data URLs included) or Anthropic's `source`. The boundary turns
each into the one form that the OpenAI and Anthropic formatters both render:
`{"type": "image", "base64": …, "mime_type": …}` with the MIME type sniffed
from the bytes (a declared type is not trusted: providers reject an image
whose bytes disagree), or `{"type": "image", "url": …}` for http(s) URLs. An
image that cannot be one of those becomes a text placeholder saying why: a
stored block a provider refuses would fail every later turn of the session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

MAX_IMAGE_BYTES = 10 * 1024 * 1024
IMAGE_BLOCK_TYPES = frozenset({"image", "image_url"})
# Magic numbers of the formats every provider we render for accepts.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_EXTENSIONS = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


@dataclass(frozen=True)
class ImageRef:
    """What is kept of an image once its pixels are folded into text."""

    hash: str
    url: str | None = None
    size: int | None = None
    mime_type: str | None = None


class ImageError(ValueError):
    """An image that cannot be used; its message is the placeholder reason."""


def is_image_block(block: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(block, dict) and block.get("type") in IMAGE_BLOCK_TYPES


def placeholder(ref: ImageRef | None, text: str) -> dict[str, str]:
    """The text block that stands in for an image (`[图片 <hash>：…]`)."""
    tag = f"图片 {ref.hash[:12]}" if ref else "图片"
    return {"type": "text", "text": f"[{tag}：{text}]"}


def _optional_text(value: Any, reason: str) -> str | None:
    """A block field that must be text when present ('' counts as absent)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ImageError(reason)
    return value


def image_source(block: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(base64 payload, URL, declared MIME type) of an image block, whatever its shape."""
    if block.get("type") == "image_url":
        inner = block.get("image_url")
        url, data, mime = inner.get("url") if isinstance(inner, dict) else inner, None, None
    elif isinstance(block.get("source"), dict):  # Anthropic's own shape
        source = block["source"]
        url, data, mime = source.get("url"), source.get("data"), source.get("media_type")
    else:
        url, data = block.get("url"), block.get("base64") or block.get("data")
        mime = block.get("mime_type")
    url = _optional_text(url, "图片地址不是文本")
    data = _optional_text(data, "图片数据无法解码")
    mime = _optional_text(mime, "图片类型不是文本")
    if url is not None and url.startswith("data:"):
        header, _, payload = url[5:].partition(",")
        if ";base64" not in header:
            raise ImageError("图片数据无法解码")
        return payload, None, header.split(";")[0] or None
    return data, url, mime


def decode(data: str) -> bytes:
    """The bytes of a base64 payload (line breaks allowed), or `ImageError`."""
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError("图片数据无法解码") from exc


def sniff_mime(raw: bytes) -> str | None:
    """The image type the bytes say they are (PNG, JPEG, GIF, WEBP), or None."""
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _MAGIC if raw.startswith(magic)), None)


def url_mime(url: str) -> str | None:
    """The image type a URL's path names by its extension, or None."""
    path = urlsplit(url).path.lower()
    return next((mime for ext, mime in _EXTENSIONS.items() if path.endswith(ext)), None)


def image_ref(block: dict[str, Any], max_bytes: int = MAX_IMAGE_BYTES) -> ImageRef:
    """Hash and describe-able facts of an image block (standard, legacy or OpenAI shape)."""
    data, url, mime = image_source(block)
    if data is not None:
        raw = decode(data)
        if len(raw) > max_bytes:
            raise ImageError(f"图片过大（{len(raw)} 字节，上限 {max_bytes} 字节）")
        return ImageRef(hashlib.sha256(raw).hexdigest(), None, len(raw), mime)
    if url is not None:
        return ImageRef(hashlib.sha256(url.encode()).hexdigest(), url, None, mime)
    raise ImageError("图片既没有数据也没有地址")


def _url_image(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise ImageError("图片地址不是 http(s) 地址")
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise ImageError("图片地址含有空白或控制字符")
    mime = url_mime(url)
    return {"type": "image", "url": url, **({"mime_type": mime} if mime else {})}


def normalise_image(block: dict[str, Any], max_bytes: int = MAX_IMAGE_BYTES) -> dict[str, str]:
    """The block in the form every provider renders, or the placeholder saying why it can't be
    (undecodable, of an unknown type, or over `max_bytes`: never stored, never re-sent).

    Idempotent: a normalised block normalises to itself.
    """
    ref = None
    try:
        data, url, _declared = image_source(block)
        if data is not None:
            raw = decode(data)
            ref = ImageRef(hashlib.sha256(raw).hexdigest(), size=len(raw))
            if len(raw) > max_bytes:
                raise ImageError(f"图片过大（{len(raw)} 字节，上限 {max_bytes} 字节）")
            mime = sniff_mime(raw)
            if mime is None:
                raise ImageError("图片格式无法识别（只收 PNG、JPEG、GIF、WEBP）")
            return {"type": "image", "base64": base64.b64encode(raw).decode(), "mime_type": mime}
        if url is not None:
            return _url_image(url)
        raise ImageError("图片既没有数据也没有地址")
    except ImageError as exc:
        return placeholder(ref, f"{exc}，未能识别")
