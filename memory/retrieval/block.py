"""The memory block the model sees: a heading and one line per memory, exact wire strings.

A memory is data, never structure: whoever wrote it (an extractor reading the
owner's words, an import, a tool), its content and kind reach the model as
one line each (`nodes.kernel.text.as_data`), so no memory can start a line of the
loop's system text or pass for one of its markers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodes.kernel.text import as_data

MEMORY_BLOCK_HEADER = "相关记忆（按相关度 × 衰减排序）："
RESTRICTED_MARKER = "群聊隔离"


def format_memory_block(results: Iterable[Any], *, restricted: bool) -> str:
    """`相关记忆…：` then `\\n- [kind] content` per result; restricted reads are marked.

    Returns '' when there is nothing to inject, so no empty block is ever sent.
    """
    lines = [f"\n- [{as_data(r.item.kind)}] {as_data(r.item.content)}" for r in results]
    if not lines:
        return ""
    marker = f"{RESTRICTED_MARKER}：" if restricted else ""
    return marker + MEMORY_BLOCK_HEADER + "".join(lines)
