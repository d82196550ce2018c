"""The lexical half of search: a BM25 index (tantivy) over every memory of every bucket.

Dense search alone misses a memory that shares a rare word with the question (a name, a
number) but not its gist, and re-ranking only the dense top candidates cannot bring it
back: on LoCoMo BM25 alone found more at 5 than the store did (0.48 against 0.35). So
search takes candidates from both sides, each over every memory it may read
(`memory.retrieval.search`), and ranks them by one rule (`memory.retrieval.ranking`).

Text is read as `terms`: casefolded Latin words, the character trigrams of each word of
four letters or more (an inflection or a typo still shares most of them), and each CJK
run as its characters and character bigrams (Chinese has no spaces to split words at).
Unstemmed: English stemming moved the bilingual set's en recall@5 from 0.88 to 0.82 and
LoCoMo's R@5 by 0.004. Measured against SQLite FTS5 and bm25s with the same terms
(`python -m tests.bench.locomo --rows lexical,scale`): alike in recall, but FTS5 scores
every row a common term matches (no top-k pruning), and bm25s cannot add or delete a
document without rebuilding.

The index lives in memory only and is rebuilt from the store when the store is opened:
one tantivy index per bucket (`LexicalIndex`), and each record's words, which the
fusion reads instead of Chroma's documents (`memory.retrieval.candidates`). Chroma holds
memory text sealed (`memory.storage.sealing`), and a forget destroys the key; an index
in files would hold the text in the clear and keep it, in segments and freed pages,
after a forget. (In RAM, a deleted document's terms stay in its tantivy segment,
unsearchable, until a merge rewrites it; they never reach a file.) Aliases
(`memory.retrieval.aliases`) are indexed with the bucket they live in, as in Chroma.
The store mirrors its own writes, supersedes, forgets and prunes at once; what another
client of a shared Chroma server (or another handle of the same folder) changes is
caught up with when a bucket's record count differs from the index's, looked at no more
than once a second (`follow`; a lone handle of an embedded store has no one to follow).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tantivy

from memory.embedding import is_cjk_run, runs
from memory.storage.records import pages
from memory.storage.sealing import Documents

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection

# How long a bucket's index is trusted before its count is compared with Chroma's again.
_RECHECK = 1.0
_FETCH = 1_000  # records read per `get` when catching up
_HEAP = 15_000_000  # tantivy's smallest writer heap: memories are short
_IDF_KEPT = 50_000  # terms whose IDF is kept between writes


def raw_terms(text: str) -> list[str]:
    """A text's terms: casefolded words and their trigrams, CJK characters and bigrams."""
    found: list[str] = []
    for run in runs(text):
        if is_cjk_run(run):
            found.extend(run)
            found.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            found.append(run)
            if len(run) > 3:
                found.extend(run[i : i + 3] for i in range(len(run) - 2))
    return found


@functools.lru_cache(maxsize=8_192)
def terms(text: str) -> tuple[str, ...]:
    """`raw_terms`, cached: the same memories come back search after search."""
    return tuple(raw_terms(text))


class Held:
    """Which of a question's terms a text holds, found without listing the text's terms
    (the fusion asks it of every candidate, most of them new at 100,000 memories). A CJK
    term, or a Latin term of three letters (a word, or a longer word's trigram, alike), is
    held where the casefolded text contains it: such a substring lies within one run. Any
    other Latin term is a whole word."""

    def __init__(self, wanted: Iterable[str]) -> None:
        wanted = list(wanted)
        self._inside = [t for t in wanted if len(t) == 3 or is_cjk_run(t)]
        self._words = [t for t in wanted if not (len(t) == 3 or is_cjk_run(t))]

    def __call__(self, text: str) -> set[str]:
        """The terms of the question that `terms(text)` holds."""
        folded = text.casefold()
        found = {t for t in self._inside if t in folded}
        if self._words:
            words = set(runs(text))
            found.update(t for t in self._words if t in words)
        return found


class _Shard:
    """One bucket's tantivy index, in RAM, with its writer and current searcher."""

    def __init__(self, schema: tantivy.Schema) -> None:
        self.index = tantivy.Index(schema)  # no path: RAM only
        # The terms come joined by spaces: `raw_terms` is the analysis.
        analyzer = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
        self.index.register_tokenizer("terms", analyzer)
        self.writer = self.index.writer(heap_size=_HEAP, num_threads=1)
        self.searcher = self.index.searcher()

    def commit(self) -> None:
        self.writer.commit()
        self.index.reload()
        self.searcher = self.index.searcher()


class LexicalIndex:
    """Every memory record's text (memories and aliases), by id and bucket, in memory.

    One tantivy index per bucket, as Chroma has a collection per bucket: a search asks
    each readable bucket's index alone, so a restricted read never reaches a persona's,
    and each is asked a pure disjunction of the question's terms. (tantivy-py collects
    through a multi-collector, which scores every record a term matches: no block-max WAND;
    ~10 M instructions a search at 100,000 memories, by callgrind.) One index whose queries
    required a bucket term took 4.6 ms a search at 100,000 memories, against 1.8 for three.
    """

    def __init__(self) -> None:
        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", tokenizer_name="raw", stored=True)
        builder.add_text_field("body", tokenizer_name="terms", index_option="freq")
        self._schema = builder.build()
        self._shards: dict[str, _Shard] = {}  # bucket → its index
        self._lock = threading.Lock()
        self._ids: dict[str, set[str]] = {}  # bucket → the record ids indexed
        self._bucket_of: dict[str, str] = {}
        # Each record's words, for the fusion's coverage: search then reads no document
        # from Chroma but those of the memories it returns (`memory.retrieval.search`).
        self._texts: dict[str, str] = {}
        self._checked: dict[str, float] = {}  # bucket → when its count was last compared
        # Each term's IDF until the next write: a search asks ~40 terms of every shard.
        self._idf: dict[str, float] = {}

    def load(self, collections: Iterable[Collection], documents: Documents) -> None:
        """Index every record of these bucket collections (the store's, as it opens)."""
        for collection in collections:
            self._catch_up(collection, documents)

    def put(self, bucket: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index records of `bucket`, replacing any earlier text under their ids."""
        if not ids:
            return
        with self._lock:
            touched = self._drop_all(ids)
            shard = self._shard(bucket)
            for record_id, text in zip(ids, texts, strict=True):
                body = " ".join(raw_terms(text))
                shard.writer.add_document(tantivy.Document(id=record_id, body=body))
                self._ids.setdefault(bucket, set()).add(record_id)
                self._bucket_of[record_id] = bucket
                self._texts[record_id] = text
            for other in touched - {bucket}:
                self._shards[other].commit()
            shard.commit()
            self._idf.clear()

    def remove(self, ids: Iterable[str]) -> None:
        """Drop records (deleted or forgotten) from the index."""
        with self._lock:
            for bucket in self._drop_all(ids):
                self._shards[bucket].commit()
            self._idf.clear()

    def search(self, asked: Sequence[str], buckets: Sequence[str], n: int) -> dict[str, list[str]]:
        """The `n` best records by BM25 among `buckets` (the only indexes a query reaches),
        for any of the question's readings; bucket → record ids, best first."""
        wanted = list(dict.fromkeys(t for text in asked for t in terms(text)))
        if not wanted or n <= 0:
            return {}
        query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "body", t))
                for t in wanted
            ]
        )
        scored: list[tuple[float, str, Any, Any]] = []
        for bucket in buckets:
            shard = self._shards.get(bucket)
            if shard is not None:
                # The searcher the hits came from: a write committed meanwhile (another
                # thread's) gives the shard a new one, where these addresses mean nothing.
                searcher = shard.searcher
                # Uncounted: the count of every match is not used (0.5 M of ~68 M instructions a
                # search at 100,000 memories).
                hits = searcher.search(query, limit=n, count=False).hits
                scored += [(score, bucket, searcher, address) for score, address in hits]
        scored.sort(key=lambda hit: hit[0], reverse=True)
        # Ids are read for the best `n` alone: a stored document costs ~10 µs to read.
        found: dict[str, list[str]] = {}
        for _, bucket, searcher, address in scored[:n]:
            found.setdefault(bucket, []).append(searcher.doc(address)["id"][0])
        return found

    def text(self, record_id: str) -> str | None:
        """A record's words as indexed (None: not indexed, or unreadable here)."""
        return self._texts.get(record_id)

    def idf(self, term: str) -> float:
        """Lucene's IDF of a term over every record: ln(1 + (N - n + 0.5) / (n + 0.5))."""
        known = self._idf.get(term)
        if known is not None:
            return known
        searchers = [shard.searcher for shard in self._shards.values()]
        n = sum(searcher.doc_freq("body", term) for searcher in searchers)
        total = sum(searcher.num_docs for searcher in searchers)
        if len(self._idf) > _IDF_KEPT:
            self._idf.clear()
        found = self._idf[term] = math.log(1 + (total - n + 0.5) / (n + 0.5))
        return found

    def follow(self, bucket: str, collection: Collection, documents: Documents) -> None:
        """Catch up with what another client changed in `bucket`: looked at once a second,
        and read in full only when Chroma's record count and the index's differ."""
        now = time.monotonic()
        if now - self._checked.get(bucket, -_RECHECK) < _RECHECK:
            return
        self._checked[bucket] = now
        if collection.count() != len(self._ids.get(bucket, ())):
            self._catch_up(collection, documents)

    def _catch_up(self, collection: Collection, documents: Documents) -> None:
        bucket = str(collection.metadata["bucket"])
        stored = {i for page in pages(collection, []) for i in page["ids"]}
        with self._lock:  # a write may be adding to it
            indexed = set(self._ids.get(bucket, ()))
        self.remove(indexed - stored)
        missing = sorted(stored - indexed)
        for start in range(0, len(missing), _FETCH):
            got: Mapping[str, Any] = collection.get(
                ids=missing[start : start + _FETCH], include=["documents"]
            )
            texts = documents.unseal(got["ids"], got["documents"])
            kept = [(i, t) for i, t in zip(got["ids"], texts, strict=True) if t is not None]
            self.put(bucket, [i for i, _ in kept], [t for _, t in kept])
            # Counted, not indexed: a record whose text this client cannot read (forgotten,
            # or sealed with a key ring it lacks) would otherwise look missing every second.
            with self._lock:
                for record_id, text in zip(got["ids"], texts, strict=True):
                    if text is None:
                        self._ids.setdefault(bucket, set()).add(record_id)
                        self._bucket_of[record_id] = bucket

    def _shard(self, bucket: str) -> _Shard:
        if bucket not in self._shards:
            self._shards[bucket] = _Shard(self._schema)
        return self._shards[bucket]

    def _drop_all(self, ids: Iterable[str]) -> set[str]:
        """Delete records from their buckets' indexes (committed by the caller); the buckets."""
        buckets = set()
        for record_id in ids:
            self._texts.pop(record_id, None)
            bucket = self._bucket_of.pop(record_id, None)
            if bucket is not None:
                self._ids[bucket].discard(record_id)
                self._shard(bucket).writer.delete_documents_by_term("id", record_id)
                buckets.add(bucket)
        return buckets
