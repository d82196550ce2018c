"""The demo world's offline senses: an image describer and a turn-end mood.

Both are deterministic stand-ins, so `cyrene demo` and Studio can show the
`resolve_vision` and `finish_turn` stages working with no network and no
model. The describer does not see the picture: it reports what the file itself
says (format, pixel size from the PNG/GIF/WebP/JPEG header, byte size) and
never downloads a URL; the loop tags each description with the image's hash.
The mood is a keyword match over the turn's text.
"""

from __future__ import annotations

import struct
from typing import Any
from urllib.parse import urlparse

from nodes.kernel.images import decode, image_source

DESCRIBER_LABEL = "演示识图"
# JPEG start-of-frame markers carry the pixel size; C4/C8/CC are other tables.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_MOODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("关切", ("累", "烦", "难过", "伤心", "生病", "压力", "tired", "sad")),
    ("开心", ("谢谢", "开心", "哈哈", "太好了", "喜欢", "thank", "happy")),
    ("认真", ("记住", "remember", "笔记", "note")),
    ("好奇", ("？", "?", "照片", "图片")),
)
CALM = "平静"
UNEASY = "为难"


def describe_image(block: dict[str, Any]) -> str:
    """describe(block) for `Vision(describer=...)`: what the image file says about itself, offline."""
    data, url, mime = image_source(block)
    if data is None:
        where = urlparse(url or "")
        name = where.path.rsplit("/", 1)[-1] or "未命名"
        return f"{DESCRIBER_LABEL}：一张来自 {where.netloc or '未知来源'} 的图片（{name}），离线演示不下载"
    raw = decode(data)
    kind, size = image_format(raw)
    facts = [f"一张 {kind or mime or '未知格式'} 图片"]
    if size:
        width, height = size
        shape = "横幅" if width > height else "竖幅" if height > width else "方形"
        facts.append(f"{width}×{height} 像素，{shape}")
    facts.append(f"{len(raw):,} 字节")
    return f"{DESCRIBER_LABEL}：" + "，".join(facts) + "（只读了文件头，未识别画面内容）"


def image_format(raw: bytes) -> tuple[str | None, tuple[int, int] | None]:
    """(format, (width, height)) read from the file header; None where the header says nothing."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR":
        return "PNG", struct.unpack(">II", raw[16:24])
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        return "GIF", struct.unpack("<HH", raw[6:10])
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "WebP", _webp_size(raw)
    if raw.startswith(b"\xff\xd8"):
        return "JPEG", _jpeg_size(raw)
    return None, None


def _webp_size(raw: bytes) -> tuple[int, int] | None:
    chunk = raw[12:16]
    if chunk == b"VP8X" and len(raw) >= 30:
        width, height = (int.from_bytes(raw[i : i + 3], "little") + 1 for i in (24, 27))
        return width, height
    if chunk == b"VP8L" and len(raw) >= 25:
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(raw) >= 30:
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    """Walk the JPEG segments to the first start-of-frame marker."""
    at = 2
    while at + 9 <= len(raw) and raw[at] == 0xFF:
        marker = raw[at + 1]
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return width, height
        at += 2 + struct.unpack(">H", raw[at + 2 : at + 4])[0]
    return None


def demo_mood(user_text: str, assistant_text: str, persona_id: str | None) -> str:
    """The turn-end hook for the demo: the first mood whose cue the user's words contain.

    A refused tool in the reply makes the persona uneasy; nothing matched is calm.
    """
    if "not_allowed" in assistant_text:
        return UNEASY
    lowered = user_text.lower()
    for mood, cues in _MOODS:
        if any(cue in lowered for cue in cues):
            return mood
    return CALM
