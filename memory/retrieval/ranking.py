"""Ranking: relevance × decay, as plain functions.

Relevance is the embedding's cosine similarity, fused (`Fusion`) with the
lexical similarity of their n-grams and discounted when the memory is
written in another script than the question.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memory.embedding import features, has_cjk
from memory.items import MemoryItem

DAY = 86_400.0


@dataclass(frozen=True)
class Decay:
    """Age-based decay with a half-life, floored so old but relevant memories still surface."""

    half_life_days: float = 30.0
    floor: float = 0.2

    def __call__(self, age_seconds: float) -> float:
        if self.half_life_days <= 0:
            return 1.0
        return max(self.floor, 0.5 ** (max(age_seconds, 0.0) / (self.half_life_days * DAY)))


@dataclass(frozen=True)
class SearchResult:
    """One ranked memory: `score = relevance × decay`."""

    item: MemoryItem
    score: float
    relevance: float
    decay: float


@dataclass(frozen=True)
class Fusion:
    """Relevance = the dense cosine, mixed with the lexical one, discounted across scripts.

    Measured on `tests/data/memory_recall.jsonl` with the multilingual default
    (`python -m tests.bench.memory`; the table is in docs/memory.md "Embedding and recall"): mixing in 20%
    of the n-gram cosine lifts Chinese recall@5 (words that are names
    and numbers count), and a memory in another script than the question
    (CJK against Latin) counting 0.6 of its similarity stops Chinese notes
    from crowding out English answers to English questions: a small
    multilingual model scores unrelated Chinese text too close to English
    queries. A memory in the other language still wins when it is clearly the
    better match. `Fusion(lexical_weight=0, other_script=1)` is dense alone.

    Attributes:
        lexical_weight: the share of the lexical cosine in the mix (0..1).
        other_script: the factor on a memory whose script differs from the query's.
    """

    lexical_weight: float = 0.2
    other_script: float = 0.6

    def relevances(
        self, query: str | Sequence[str], documents: list[str], distances: list[float]
    ) -> list[float]:
        """The fused relevance, in [0, 1], of each document for `query`.

        `query` may be several readings of one question (`memory.retrieval.perspective.readings`,
        the question as written first): the lexical half takes the best of them.
        """
        asked = [query] if isinstance(query, str) else list(query)
        dense = np.clip(1.0 - np.asarray(distances, dtype=np.float32), 0.0, 1.0)
        if self.lexical_weight:
            grams = [_grams(text) for text in asked]
            lexical = np.asarray(
                [max(_cosine(reading, _grams(text)) for reading in grams) for text in documents]
            )
            dense = (1 - self.lexical_weight) * dense + self.lexical_weight * lexical
        script = has_cjk(asked[0])
        factors = [1.0 if has_cjk(d) == script else self.other_script for d in documents]
        return [float(r) for r in dense * np.asarray(factors, dtype=np.float32)]


@functools.lru_cache(maxsize=8_192)
def _grams(text: str) -> tuple[Counter[str], float]:
    """A text's n-gram counts (`memory.embedding.features`) and their norm; cached, as the
    same memories come back search after search."""
    counts = Counter(features(text))
    return counts, math.sqrt(sum(n * n for n in counts.values()))


def _cosine(a: tuple[Counter[str], float], b: tuple[Counter[str], float]) -> float:
    """The cosine of two n-gram counts: the lexical half of the fusion. Counted exactly
    rather than through hashed vectors: a search at 100,000 items meets ~50 memories it
    has not seen, and hashing each one cost ~0.2 ms."""
    (small, small_norm), (large, large_norm) = sorted((a, b), key=lambda g: len(g[0]))
    if not small_norm or not large_norm:
        return 0.0
    found = large.get
    return sum(n * found(gram, 0) for gram, n in small.items()) / (small_norm * large_norm)


def rank(
    candidates: list[tuple[MemoryItem, float]],
    *,
    now: float,
    decay: Decay,
    k: int,
    min_relevance: float,
) -> list[SearchResult]:
    """Top `k` of (item, relevance) pairs by relevance × decay."""
    results = []
    for item, relevance in candidates:
        if relevance < min_relevance:
            continue
        factor = decay(now - item.created_at)
        results.append(SearchResult(item, relevance * factor, relevance, factor))
    results.sort(key=lambda r: r.score, reverse=True)
    return results[:k]
