"""The owner's questions in the words their memories are written in.

Memories about the owner are written in the third person ("主人养了一只叫团子的橘猫",
"The owner is lactose intolerant"; `LLMExtractor` is asked to write them so), but
the owner asks in the first person ("我的宠物叫什么名字？", "Can I have a
milkshake?"). In an owner session, the one reader whose "I" is the owner, a search
embeds the question and its owner-perspective rewrite in one batch and searches
along their mean direction; the lexical half of the fusion takes the better of
the two readings (English recall@1 0.56 → 0.64 on the set). Replacing the
question outright did worse on the recall set (`python -m tests.bench.memory`):
it loses what a first-person memory ("我喜欢乌龙茶", stored word for word)
shares with the question.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_ENGLISH = [
    (re.compile(pattern, re.IGNORECASE), replacement)
    for pattern, replacement in (
        (r"\bI'm\b|\bI am\b", "the owner is"),
        (r"\bam I\b", "is the owner"),
        (r"\bI've\b", "the owner has"),
        (r"\bI'd\b", "the owner would"),
        (r"\bI'll\b", "the owner will"),
        (r"\bmy\b|\bmine\b", "the owner's"),
        (r"\bme\b|\bmyself\b", "the owner"),
        (r"\bI\b", "the owner"),
    )
]


def owner_perspective(text: str) -> str:
    """`text` with the speaker's "I" as the owner: 我 → 主人 (not 我们, which includes the
    companion), I / me / my → the owner / the owner's."""
    text = re.sub(r"我(?!们)", "主人", text)
    for pattern, replacement in _ENGLISH:
        text = pattern.sub(replacement, text)
    return text


def readings(query: str, owner: bool) -> list[str]:
    """The texts a search reads `query` as: itself, and for the owner's question its
    owner-perspective rewrite when that differs."""
    rewritten = owner_perspective(query) if owner else query
    return [query] if rewritten == query else [query, rewritten]


def query_vector(embed_query: Callable[[list[str]], Sequence[Any]], texts: list[str]) -> Any:
    """The vector to search with: the mean direction of the query's readings (one batch)."""
    if len(texts) == 1:
        return embed_query(texts)[0]
    mean = np.sum(np.asarray(embed_query(texts), dtype=np.float32), axis=0)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm else mean
