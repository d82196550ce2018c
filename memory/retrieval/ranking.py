"""Ranking: candidates from the dense and the lexical side, one relevance, age as a tie-break.

relevance = (w × best cosine × coverage + (1 − w) × cosine + a × coverage × cosine) ÷ (1 + a)
(`Fusion`: w is `lexical_weight`, a `agreement`), in [0, 1]: coverage is the share of the
question's information (the IDF of its terms, `memory.retrieval.lexical`) a memory holds;
cosine is the embedding's, counted at `other_script` of itself for a memory in another
script than the question; the best cosine is that of the question's nearest candidate.

score = relevance ÷ the best candidate's relevance + `tie_break` × decay (`rank`). Age
never buries relevance: decay is in [floor, 1], so it reorders only memories whose
relevances are within `tie_break` × (1 − floor) of the best one's (0.8% by default). A
multiplier did bury it: under relevance × decay (half-life 30 days, floor 0.2), LoCoMo
R@5 fell from 0.35 to 0.12 once its memories carried their real dates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from memory.embedding import has_cjk
from memory.items import MemoryItem
from memory.retrieval.lexical import Held, terms

DAY = 86_400.0
# The least relevance a search returns: a memory that shares no word with the question
# and whose cosine is under 0.125 is noise (`Fusion()` counts a cosine alone at 0.2 of itself;
# the rule before counted it at 0.4, with this floor at 0.05).
MIN_RELEVANCE = 0.025


@dataclass(frozen=True)
class Decay:
    """Age-based decay with a half-life and a floor, and how much it counts in a score.

    Attributes:
        half_life_days: the age at which decay is 0.5 (0: no decay).
        floor: the least decay, however old.
        tie_break: the weight of decay added to a relevance normalised to the best
            candidate's (module docstring); 0 ranks by relevance alone.
    """

    half_life_days: float = 30.0
    floor: float = 0.2
    tie_break: float = 0.01

    @property
    def reach(self) -> float:
        """The most age can move a score, as a share of the best relevance: a memory further
        than this below the `k`-th best cannot enter the top `k`."""
        return self.tie_break * (1 - self.floor) if self.half_life_days > 0 else 0.0

    def __call__(self, age_seconds: float) -> float:
        if self.half_life_days <= 0:
            return 1.0
        return max(self.floor, 0.5 ** (max(age_seconds, 0.0) / (self.half_life_days * DAY)))


@dataclass(frozen=True)
class SearchResult:
    """One ranked memory: `score = relevance ÷ the best candidate's + tie_break × decay`."""

    item: MemoryItem
    score: float
    relevance: float
    decay: float


@dataclass(frozen=True)
class Fusion:
    """Relevance from coverage and cosine: coverage weighed by how close the question's
    nearest candidate is, cosine, and their agreement (module docstring).

    Coverage counts `lexical_weight` × the best candidate's cosine: a question whose nearest
    memory is far was asked in other words than any memory holds (a paraphrase: "Can I have
    a milkshake?" ← "The owner is lactose intolerant"), so the words it shares with a memory
    are more likely common ones; a question the embedding places close to a memory is one
    whose words the memories use, and shared rare words then single the answer out. The
    agreement term rewards a memory both sides find. Dividing every relevance by the best
    cosine gives coverage a fixed weight against the cosine relative to the best: the
    cosine normalised to its candidates, coverage left absolute. Chosen on LoCoMo and the
    bilingual set together (`docs/memory.md`, the table of rules tried): 0.6 × coverage +
    0.4 × cosine, LoCoMo's choice, missed the bilingual set's target, and every rule that
    met it lost LoCoMo's R@10. A memory in another script than the question (CJK against
    Latin) counts 0.6 of its cosine: a small multilingual model scores unrelated Chinese
    text too close to English questions. `Fusion(lexical_weight=0, other_script=1)` is
    dense alone (search then takes no lexical candidates), its relevance the cosine.

    Attributes:
        lexical_weight: the weight of coverage, times the best candidate's cosine (0..1).
        other_script: the factor on the cosine of a memory whose script differs from the query's.
        agreement: the weight of coverage × cosine.
    """

    lexical_weight: float = 0.7
    other_script: float = 0.6
    agreement: float = 0.5

    def relevances(
        self,
        asked: Sequence[str],
        documents: Sequence[str],
        distances: Sequence[float],
        idf: Callable[[str], float],
    ) -> list[float]:
        """The fused relevance, in [0, 1], of each document for the question.

        Args:
            asked: the question's readings (`memory.retrieval.perspective.readings`, as
                written first); coverage takes the best of them.
            documents: the candidates' texts.
            distances: their cosine distances to the question's vector.
            idf: a term's IDF over the store (`memory.retrieval.lexical.LexicalIndex.idf`).
        """
        cosine = np.clip(1.0 - np.asarray(distances, dtype=np.float32), 0.0, 1.0)
        script = has_cjk(asked[0])
        factors = np.asarray(
            [1.0 if has_cjk(d) == script else self.other_script for d in documents],
            dtype=np.float32,
        )
        dense = cosine * factors
        if not self.lexical_weight:
            return [float(r) for r in dense]
        weights = [{t: idf(t) for t in set(terms(text))} for text in asked]
        readings = [(w, sum(w.values())) for w in weights]
        held = Held({t for w in weights for t in w})
        covered = np.asarray([_coverage(readings, held(d)) for d in documents])
        nearest = float(dense.max(initial=0.0))
        fused = (
            self.lexical_weight * nearest * covered
            + (1 - self.lexical_weight) * dense
            + self.agreement * covered * dense
        ) / (1 + self.agreement)
        return [float(r) for r in fused]


def _coverage(readings: Sequence[tuple[dict[str, float], float]], held: set[str]) -> float:
    """The share of a reading's IDF that a memory's terms hold, the best reading's: unlike
    BM25 normalised to its best hit, a memory that shares only common words scores near 0."""
    shares = [
        sum(weights.get(t, 0.0) for t in held) / total  # held is the shorter to walk
        for weights, total in readings
        if total
    ]
    return max(shares, default=0.0)


def rank(
    candidates: list[tuple[MemoryItem, float]],
    *,
    now: float,
    decay: Decay,
    k: int,
    min_relevance: float,
) -> list[SearchResult]:
    """Top `k` of (item, relevance) pairs by relevance ÷ the best one's + tie-break × decay
    (module docstring); those under `min_relevance` left out."""
    top = max((relevance for _, relevance in candidates), default=0.0) or 1.0
    results = []
    for item, relevance in candidates:
        if relevance < min_relevance:
            continue
        factor = decay(now - item.created_at)
        score = relevance / top + decay.tie_break * factor
        results.append(SearchResult(item, score, relevance, factor))
    results.sort(key=lambda r: r.score, reverse=True)
    return results[:k]
