"""Ranking: relevance × decay (seed `Retriever`), as plain functions."""

from __future__ import annotations

from dataclasses import dataclass

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


def relevance_from_distance(distance: float) -> float:
    """Cosine distance (0 = same direction) → relevance in [0, 1]."""
    return min(1.0, max(0.0, 1.0 - distance))


def rank(
    candidates: list[tuple[MemoryItem, float]],
    *,
    now: float,
    decay: Decay,
    k: int,
    min_relevance: float,
) -> list[SearchResult]:
    """Top `k` of (item, cosine distance) pairs by relevance × decay."""
    results = []
    for item, distance in candidates:
        relevance = relevance_from_distance(distance)
        if relevance < min_relevance:
            continue
        factor = decay(now - item.created_at)
        results.append(SearchResult(item, relevance * factor, relevance, factor))
    results.sort(key=lambda r: r.score, reverse=True)
    return results[:k]
