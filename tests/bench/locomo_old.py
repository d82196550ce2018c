"""The store's search before issue 31, as a LoCoMo rank function: the row the new search is
measured against (`tests.bench.memory` prints it beside the others).

Before issue 31 a search took the embedding's (USE) 32 nearest memories of each bucket,
scored each 0.8 × cosine + 0.2 × the cosine of the two texts' n-gram counts (the better
of the question's readings), times 0.6 for a memory in another script than the question,
and ranked by that relevance × decay (half-life 30 days, floor 0.2), memories under 0.05
left out. Rebuilt here from those rules over the same cached vectors as the candidate
rows (`tests.bench.locomo_candidates.dense_side`), so it needs no store of that version.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from memory.embedding import features, has_cjk
from memory.retrieval.perspective import readings
from tests.bench.locomo import Corpus, RankFunction, Search
from tests.bench.locomo_candidates import DECAY, OTHER_SCRIPT, dense_side

POOL = 32
LEXICAL_WEIGHT = 0.2
MIN_RELEVANCE = 0.05


@lru_cache(maxsize=16_384)
def _grams(text: str) -> tuple[Counter[str], float]:
    counts = Counter(features(text))
    return counts, math.sqrt(sum(n * n for n in counts.values()))


def _gram_cosine(a: str, b: str) -> float:
    (one, one_norm), (two, two_norm) = _grams(a), _grams(b)
    if not one_norm or not two_norm:
        return 0.0
    return sum(n * two.get(gram, 0) for gram, n in one.items()) / (one_norm * two_norm)


def old_store() -> RankFunction:
    """The pre-issue-31 search (module docstring) over USE's cached vectors."""
    dense = dense_side("use")

    def index(corpus: Corpus) -> Search:
        nearest = dense(corpus)

        def search(question: str, k: int) -> Sequence[str]:
            asked = readings(question, corpus.owner)
            script = has_cjk(asked[0])
            scored = []
            for i, cosine in nearest(asked, POOL):
                memory = corpus.memories[i]
                lexical = max(_gram_cosine(text, memory.text) for text in asked)
                relevance = (1 - LEXICAL_WEIGHT) * max(cosine, 0.0) + LEXICAL_WEIGHT * lexical
                if has_cjk(memory.text) != script:
                    relevance *= OTHER_SCRIPT
                if relevance >= MIN_RELEVANCE:
                    age = corpus.now - memory.created_at
                    scored.append((relevance * DECAY(age), -i, memory.id))
            return [memory_id for *_, memory_id in sorted(scored, reverse=True)[:k]]

        return search

    return index
