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

The index lives in memory only and is rebuilt from the store when the store is opened.
Chroma holds memory text sealed (`memory.storage.sealing`), and a forget destroys the
key; an index in files would hold the text in the clear and keep it, in segments and
freed pages, after a forget. (In RAM, a deleted document's terms stay in its tantivy
segment, unsearchable, until a merge rewrites it; they never reach a file.) Aliases
(`memory.retrieval.aliases`) are indexed with the bucket they live in, as in Chroma. The store mirrors its own writes, supersedes, forgets
and prunes at once; what another client of a shared Chroma server (or another handle of
the same folder) changes is caught up with when a bucket's record count differs from
the index's, looked at no more than once a second (`follow`).
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


class LexicalIndex:
    """Every memory record's text (memories and aliases), by id and bucket, in memory."""

    def __init__(self) -> None:
        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", tokenizer_name="raw", stored=True)
        builder.add_text_field("bucket", tokenizer_name="raw", stored=True)
        builder.add_text_field("body", tokenizer_name="terms", index_option="freq")
        self._schema = builder.build()
        self._index = tantivy.Index(self._schema)  # no path: RAM only
        # The terms come joined by spaces: `raw_terms` is the analysis.
        analyzer = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
        self._index.register_tokenizer("terms", analyzer)
        self._writer = self._index.writer(heap_size=_HEAP, num_threads=1)
        self._lock = threading.Lock()
        self._ids: dict[str, set[str]] = {}  # bucket → the record ids indexed
        self._bucket_of: dict[str, str] = {}
        self._checked: dict[str, float] = {}  # bucket → when its count was last compared
        self._searcher = self._index.searcher()

    def load(self, collections: Iterable[Collection], documents: Documents) -> None:
        """Index every record of these bucket collections (the store's, as it opens)."""
        for collection in collections:
            self._catch_up(collection, documents)

    def put(self, bucket: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index records of `bucket`, replacing any earlier text under their ids."""
        if not ids:
            return
        with self._lock:
            for record_id, text in zip(ids, texts, strict=True):
                self._drop(record_id)
                body = " ".join(raw_terms(text))
                self._writer.add_document(tantivy.Document(id=record_id, bucket=bucket, body=body))
                self._ids.setdefault(bucket, set()).add(record_id)
                self._bucket_of[record_id] = bucket
            self._commit()

    def remove(self, ids: Iterable[str]) -> None:
        """Drop records (deleted or forgotten) from the index."""
        with self._lock:
            known = [i for i in ids if i in self._bucket_of]
            for record_id in known:
                self._drop(record_id)
            if known:
                self._commit()

    def search(self, asked: Sequence[str], buckets: Sequence[str], n: int) -> dict[str, list[str]]:
        """The `n` best records by BM25 among `buckets` (the only ones a query can reach), for
        any of the question's readings; bucket → record ids, best first."""
        wanted = list(dict.fromkeys(t for text in asked for t in terms(text)))
        if not wanted or not buckets or n <= 0:
            return {}
        words = [
            (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "body", t))
            for t in wanted
        ]
        query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, tantivy.Query.term_set_query(self._schema, "bucket", buckets)),
                (tantivy.Occur.Must, tantivy.Query.boolean_query(words)),
            ]
        )
        searcher = self._searcher
        found: dict[str, list[str]] = {}
        for _, address in searcher.search(query, limit=n).hits:
            doc = searcher.doc(address)
            found.setdefault(doc["bucket"][0], []).append(doc["id"][0])
        return found

    def idf(self, term: str) -> float:
        """Lucene's IDF of a term over every record: ln(1 + (N - n + 0.5) / (n + 0.5))."""
        searcher = self._searcher
        n = searcher.doc_freq("body", term)
        return math.log(1 + (searcher.num_docs - n + 0.5) / (n + 0.5))

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

    def _drop(self, record_id: str) -> None:
        self._writer.delete_documents_by_term("id", record_id)
        bucket = self._bucket_of.pop(record_id, None)
        if bucket is not None:
            self._ids[bucket].discard(record_id)

    def _commit(self) -> None:
        self._writer.commit()
        self._index.reload()
        self._searcher = self._index.searcher()
