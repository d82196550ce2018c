"""The store's ranking replayed over captured candidates: a `Fusion` scored on LoCoMo and
the bilingual set in seconds instead of minutes.

    python -m tests.bench.fusion_replay                                # the default Fusion
    python -m tests.bench.fusion_replay --weights 0.6,0.7 --agreements 0,0.5

Capturing opens a real store per corpus, written as the benches write it (the bilingual
set as `tests.bench.memory` does: three buckets, the owner asking as persona `xilian`;
each LoCoMo conversation as `tests.bench.locomo` does: user scope, a restricted read), and
records each question's readings, the candidates `MemoryStore.search` takes for it (its
own `_candidates`: the embedding's nearest of each bucket and the lexical index's best,
with their words and cosine distances), their dates and the IDF of the question's terms.
It is cached under `~/.cache/cyrene-bench/` by the data and the pool. Scoring then runs
`Fusion.relevances` and `rank` on them as `search` does (these stores hold no aliases, and
the reader may read every candidate), so the default reads what the benches read, to the
third decimal. Rules beyond `Fusion`'s fields are tried by editing `Fusion.relevances`.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory import Fusion, MemoryItem, MemoryStore, MultilingualEmbedding
from memory.retrieval import search
from memory.retrieval.lexical import terms
from memory.retrieval.perspective import query_vector, readings
from memory.retrieval.ranking import MIN_RELEVANCE, Decay, rank
from nodes.kernel.text import clean_text
from tests.bench import memory as bench_memory
from tests.bench.locomo import DATA_ENV, load_locomo, locomo_path, remember_corpus

DEPTH = 10  # the benches' deepest rank (R@10, MRR@10)
CACHE = Path.home() / ".cache" / "cyrene-bench"


@dataclass(frozen=True)
class Asked:
    """One question as a search saw it.

    Attributes:
        readings: the texts it was read as (`memory.retrieval.perspective.readings`).
        items: each candidate as a memory (its words and date).
        distances: each candidate's cosine distance to the question's vector.
        idf: the IDF of each of the question's terms over the store.
        answers: the ids of the memories that answer it.
        group: "zh" or "en" (bilingual), else the LoCoMo category.
    """

    readings: list[str]
    items: list[MemoryItem]
    distances: list[float]
    idf: dict[str, float]
    answers: frozenset[str]
    group: str


@dataclass(frozen=True)
class Captured:
    """A corpus's questions, the clock they were asked at, and each memory text's ids."""

    name: str
    now: float
    questions: list[Asked]
    ids: dict[str, list[str]]


def _capture(
    store: MemoryStore,
    asked: Sequence[tuple[str, frozenset[str], str]],
    reader: str | None,
    restricted: bool,
) -> list[Asked]:
    out = []
    for question, answers, group in asked:
        texts = readings(clean_text(question), owner=not restricted)
        vector = query_vector(store.embedding_function.embed_query, texts)
        # The store's own candidates, gathered as `Search._search` gathers them.
        collections = {search._bucket(c): c for c in store._readable(reader, restricted)}
        n = max(DEPTH * 2, search._POOL)
        lexical = store._lexical_side(texts, collections, n)
        found = store._candidates(collections, vector, lexical, n)
        created: dict[str, float] = {}
        for bucket in {c.bucket for c in found}:
            collection = store._collection(bucket, create=False)
            assert collection is not None
            got = collection.get(ids=[c.record_id for c in found if c.bucket == bucket])
            created.update(
                (i, float(m["created_at"]))
                for i, m in zip(got["ids"], got["metadatas"], strict=True)
            )
        items = [MemoryItem(content=c.text, created_at=created[c.record_id]) for c in found]
        idf = {t: store._lexical.idf(t) for text in texts for t in terms(text)}
        out.append(Asked(texts, items, [c.distance for c in found], idf, answers, group))
    return out


def capture_bilingual() -> Captured:
    data = bench_memory.load_set()
    notes = [*data.facts, *data.distractors]
    with (
        tempfile.TemporaryDirectory() as folder,
        bench_memory.open_store(Path(folder), MultilingualEmbedding()) as store,
    ):
        store.add_many(bench_memory.item(note["text"], n) for n, note in enumerate(notes))
        asked = [(f["question"], frozenset({clean_text(f["text"])}), f["lang"]) for f in data.facts]
        questions = _capture(store, asked, bench_memory.READER, False)
    ids = {clean_text(n["text"]): [clean_text(n["text"])] for n in notes}
    return Captured("bilingual", bench_memory.NOW, questions, ids)


def capture_locomo(path: Path) -> list[Captured]:
    captured = []
    for corpus in load_locomo(path):
        with (
            tempfile.TemporaryDirectory() as folder,
            MemoryStore.open(folder, clock=lambda c=corpus: c.now) as store,
        ):
            ids = remember_corpus(store, corpus)
            asked = [(q.text, q.answers, q.group) for q in corpus.questions]
            captured.append(
                Captured(corpus.name, corpus.now, _capture(store, asked, None, True), ids)
            )
        print(f"  captured {corpus.name}", flush=True)
    return captured


def captured_sets(path: Path | None) -> list[Captured]:
    """The bilingual set and (with its data) LoCoMo, captured once and cached."""
    sources = [
        bench_memory.DATA.read_bytes(),
        path.read_bytes() if path else b"",
        str(search._POOL).encode(),
    ]
    digest = hashlib.sha256(b"\x00".join(sources)).hexdigest()[:16]
    cached = CACHE / f"fusion-replay-{digest}.pkl"
    if cached.exists():
        loaded: list[Captured] = pickle.loads(cached.read_bytes())
        return loaded
    sets = [capture_bilingual(), *(capture_locomo(path) if path else [])]
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(pickle.dumps(sets))
    return sets


def first_ranks(
    fusion: Fusion, captured: Captured, decay: Decay, min_relevance: float = MIN_RELEVANCE
) -> list[tuple[str, int]]:
    """(group, rank of the first answer within `DEPTH`, 0 if none) of each question."""
    found = []
    for asked in captured.questions:
        relevances = fusion.relevances(
            asked.readings, [i.content for i in asked.items], asked.distances, asked.idf.__getitem__
        )
        results = rank(
            list(zip(asked.items, relevances, strict=True)),
            now=captured.now,
            decay=decay,
            k=DEPTH,
            min_relevance=min_relevance,
        )
        hits = [i for r in results for i in captured.ids[r.item.content]][:DEPTH]
        found.append(
            (asked.group, next((n for n, i in enumerate(hits, 1) if i in asked.answers), 0))
        )
    return found


def _recall(found: Sequence[tuple[str, int]], k: int) -> float:
    return sum(0 < r <= k for _, r in found) / max(len(found), 1)


def scores(fusion: Fusion, sets: Sequence[Captured]) -> dict[str, tuple[float, ...]]:
    """LoCoMo flat and dated R@1 / R@5 / R@10; bilingual recall@1 / recall@5 per language."""
    out: dict[str, tuple[float, ...]] = {}
    bilingual = first_ranks(fusion, sets[0], Decay())
    for lang in ("zh", "en"):
        mine = [f for f in bilingual if f[0] == lang]
        out[lang] = (_recall(mine, 1), _recall(mine, 5))
    if len(sets) > 1:
        flat, dated = Decay(half_life_days=0), Decay()
        for clock, decay in (("flat", flat), ("dated", dated)):
            found = [f for c in sets[1:] for f in first_ranks(fusion, c, decay)]
            out[clock] = tuple(_recall(found, k) for k in (1, 5, 10))
    return out


def _line(label: str, got: Mapping[str, Any]) -> str:
    cells = [
        f"{key} " + " / ".join(f"{x:.3f}" for x in got[key])
        for key in ("flat", "dated")
        if key in got
    ]
    cells += [f"{lang} " + " / ".join(f"{x:.2f}" for x in got[lang]) for lang in ("zh", "en")]
    return f"{label}: " + "; ".join(cells)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--weights", default=str(Fusion().lexical_weight), help="lexical weights, comma-separated"
    )
    parser.add_argument(
        "--agreements", default=str(Fusion().agreement), help="agreement weights, comma-separated"
    )
    args = parser.parse_args(argv)
    path = locomo_path()
    if path is None or not path.exists():
        print(f"(LoCoMo not found: ${DATA_ENV}; the bilingual set alone)")
        path = None
    sets = captured_sets(path)
    for weight in (float(w) for w in args.weights.split(",")):
        for agreement in (float(a) for a in args.agreements.split(",")):
            fusion = Fusion(lexical_weight=weight, agreement=agreement)
            print(
                _line(f"lexical weight {weight:g}, agreement {agreement:g}", scores(fusion, sets)),
                flush=True,
            )


if __name__ == "__main__":
    main()
