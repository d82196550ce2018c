"""The memory block the model sees (DESIGN §6; seed `formatMemoryBlock`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MEMORY_BLOCK_HEADER = "相关记忆（按相关度 × 衰减排序）："
RESTRICTED_MARKER = "群聊隔离"


def format_memory_block(results: Iterable[Any], *, restricted: bool) -> str:
    """`相关记忆…：` then `\\n- [kind] content` per result; restricted reads are marked.

    Returns '' when there is nothing to inject, so no empty block is ever sent.
    """
    lines = [f"\n- [{r.item.kind}] {r.item.content}" for r in results]
    if not lines:
        return ""
    marker = f"{RESTRICTED_MARKER}：" if restricted else ""
    return marker + MEMORY_BLOCK_HEADER + "".join(lines)
