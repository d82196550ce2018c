"""`MemoryStore`'s read half: one memory by id, every memory, the memory block's search, the
extractor's ranking, and the near-duplicate check's neighbours.

A search reads the reader's buckets side by side (`memory.storage.layout`: the persona's,
user and project; restricted reads only the shared two), and a search takes candidates
from both the embedding's nearest and the lexical index's best over those same buckets
(`memory.retrieval.lexical`; ranked by `memory.retrieval.ranking`). Each reads a hit on a
superseded fact's words as a hit on what replaced it (`memory.retrieval.aliases`), and
guards each hit's owner a second time (`memory.storage.records.may_read`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from memory.embedding import cosines
from memory.items import MemoryItem, Scope, bucket_name
from memory.retrieval.aliases import resolve
from memory.retrieval.candidates import (
    Candidate,
    nearest_distances,
    stored_distances,
    stored_texts,
)
from memory.retrieval.lexical import LexicalIndex
from memory.retrieval.perspective import query_vector, readings
from memory.retrieval.ranking import Decay, Fusion, SearchResult, rank
from memory.storage.erasure import Gate, gated
from memory.storage.lock import StoreLock
from memory.storage.records import closest, every_item, item_key, may_read, records
from memory.storage.sealing import Documents
from nodes.kernel.text import clean_text

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection

_SHARED_BUCKETS = (Scope.USER.value, Scope.PROJECT.value)
# Candidates per bucket from the embedding, and from the lexical index over all the
# readable buckets: enough that fusion can reorder past either side's top few. 30 ranks as
# 50 did on LoCoMo and the bilingual set alike (20 lost .003 of LoCoMo's R@10), and each
# candidate costs the fusion and Chroma's reads (`python -m tests.bench.memory --scale`).
_POOL = 30
_AGELESS = Decay(half_life_days=0)
# What an extractor is shown is ranked by the embedding alone: the bars it is judged by
# (`nodes.extraction.extractors.SUPERSEDE_RELEVANCE`, `memory.lifecycle.operations.
# MIN_TARGET_RELEVANCE`) were measured on an embedding-led scale, and a correction is a
# paraphrase of what it corrects more than it shares its words ("更正一下，我搬到滨江区了"
# against "主人住在杭州西湖区": 0.35 with a fifth of coverage, 0.42 by the embedding).
_EXTRACTOR_FUSION = Fusion(lexical_weight=0.0)


class Search:
    """Mixed into `MemoryStore`, which provides the members declared below."""

    embedding_function: Any
    fusion: Fusion
    decay: Decay
    min_relevance: float
    clock: Callable[[], float]
    _gate: Gate
    _documents: Documents
    _bucket_pool: ThreadPoolExecutor
    _lexical: LexicalIndex
    _lock: StoreLock | None

    if TYPE_CHECKING:

        def _collection(self, bucket: str, *, create: bool) -> Collection | None: ...
        def _stored(self) -> builtins.list[Collection]: ...
        def _find(self, item_id: str) -> tuple[Collection, Mapping[str, Any]] | None: ...

    def readable_buckets(self, persona_id: str | None, restricted: bool) -> builtins.list[str]:
        """The read set: P's persona scope ∪ user ∪ project; restricted → user ∪ project."""
        if restricted or not persona_id:
            return builtins.list(_SHARED_BUCKETS)
        return [bucket_name(Scope.PERSONA, persona_id), *_SHARED_BUCKETS]

    @gated
    def get(self, item_id: str) -> MemoryItem | None:
        """One memory by id.

        Args:
            item_id: the memory's id.

        Returns:
            The memory, or None when there is none with that id.
        """
        found = self._find(item_id)
        return records(found[1], self._documents)[0] if found is not None else None

    @gated
    def list(
        self, *, scope: Scope | str | None = None, persona_id: str | None = None
    ) -> builtins.list[MemoryItem]:
        """Every stored memory, optionally of one scope / persona, oldest first.

        Args:
            scope: only this scope.
            persona_id: only this persona's memories.

        Returns:
            The memories, oldest first.

        Raises:
            ValueError: an unknown scope.
        """
        scope = Scope(scope) if scope is not None else None
        items: builtins.list[MemoryItem] = []
        for collection in self._stored():
            items.extend(every_item(collection, self._documents))
        items = [
            i
            for i in items
            if (scope is None or i.scope is scope)
            and (persona_id is None or i.persona_id == persona_id)
        ]
        return sorted(items, key=lambda i: i.created_at)

    @gated
    def search(
        self, query: str, persona_id: str | None = None, restricted: bool = False, k: int = 8
    ) -> builtins.list[SearchResult]:
        """The `k` most relevant memories the reader may see; age only breaks near-ties
        (`memory.retrieval.ranking`).

        Args:
            query: the text to match (usually the turn's message).
            persona_id: the reading persona; its private memories are included.
            restricted: a group/stranger read: shared scopes only, never persona memories.
            k: how many results at most.

        Returns:
            Up to `k` results, best first; [] for an empty query or `k <= 0`.
        """
        return self._search(query, persona_id, restricted, k, self.decay, self.fusion)

    @gated
    def relevant(
        self, query: str, persona_id: str | None = None, k: int = 8
    ) -> builtins.list[SearchResult]:
        """The `k` memories `persona_id` may read (unrestricted) most relevant to `query`,
        whatever their age (`memory.protocols.RanksByRelevance`): what an extractor is
        shown, since the fact a new one replaces is usually an old one."""
        return self._search(query, persona_id, False, k, _AGELESS, _EXTRACTOR_FUSION)

    def _search(
        self,
        query: str,
        persona_id: str | None,
        restricted: bool,
        k: int,
        decay: Decay,
        fusion: Fusion,
    ) -> builtins.list[SearchResult]:
        if not query.strip() or k <= 0:
            return []
        reader = clean_text(persona_id) if persona_id else None
        asked = readings(clean_text(query), owner=not restricted)
        collections = {_bucket(c): c for c in self._readable(reader, restricted)}
        n = max(k * 2, _POOL)
        # The lexical side needs no vector: it searches on the pool while the query is embedded.
        lexical = (
            self._bucket_pool.submit(self._lexical_side, asked, collections, n)
            if fusion.lexical_weight
            else None
        )
        vector = query_vector(self.embedding_function.embed_query, asked)
        found = self._candidates(collections, vector, lexical.result() if lexical else {}, n)
        relevances = fusion.relevances(
            asked,
            [c.text for c in found],
            [c.distance for c in found],
            self._lexical.idf,
        )
        best = self._best(found, relevances, reader, restricted, k, decay)
        return rank(
            builtins.list(best.values()),
            now=self.clock(),
            decay=decay,
            k=k,
            min_relevance=self.min_relevance,
        )

    def _best(
        self,
        found: Sequence[Candidate],
        relevances: Sequence[float],
        reader: str | None,
        restricted: bool,
        k: int,
        decay: Decay,
    ) -> dict[str, tuple[MemoryItem, float]]:
        """The memories `rank` needs, read from Chroma: the most relevant until there are `k`,
        and every one that age could still lift among them (`Decay.reach`). Each is the
        memory with its better relevance, as itself or through one of its aliases."""
        order = sorted(
            (n for n, r in enumerate(relevances) if r >= self.min_relevance),
            key=relevances.__getitem__,
            reverse=True,
        )
        reach = decay.reach * (relevances[order[0]] if order else 0.0)
        best: dict[str, tuple[MemoryItem, float]] = {}
        done = 0
        while done < len(order):
            end = done + k - len(best)
            if len(best) >= k:
                kth = sorted((r for _, r in best.values()), reverse=True)[k - 1]
                end = next(
                    (n for n in range(done, len(order)) if relevances[order[n]] < kth - reach),
                    len(order),
                )
                if end == done:
                    break
            batch = order[done:end]
            done = end
            for n, item in self._memories(found, batch, reader, restricted):
                relevance = relevances[n]
                key = item_key(item)
                if key not in best or relevance > best[key][1]:
                    best[key] = (item, relevance)
        return best

    def _memories(
        self, found: Sequence[Candidate], batch: Sequence[int], reader: str | None, restricted: bool
    ) -> builtins.list[tuple[int, MemoryItem]]:
        """The memory each of these candidates (by position in `found`) stands for: itself, or
        an alias's successor, read from its bucket; those the reader may not read dropped
        loudly."""
        by_bucket: dict[str, builtins.list[int]] = {}
        for n in batch:
            by_bucket.setdefault(found[n].bucket, []).append(n)

        def read(bucket: str) -> builtins.list[tuple[int, MemoryItem]]:
            collection = self._collection(bucket, create=False)
            if collection is None:
                return []
            ids = [found[n].record_id for n in by_bucket[bucket]]
            got = collection.get(ids=ids, include=["documents", "metadatas"])
            stands_for = resolve(collection, got, self._documents)
            return [
                (n, stands_for[i])
                for n, i in zip(by_bucket[bucket], ids, strict=True)
                if i in stands_for
            ]

        pairs = [pair for got in self._bucket_pool.map(read, by_bucket) for pair in got]
        return [(n, item) for n, item in pairs if may_read(item, reader, restricted)]

    @gated
    def nearest(
        self, text: str, persona_id: str | None = None, k: int = 8, min_cosine: float = -1.0
    ) -> builtins.list[tuple[MemoryItem, float]]:
        """The `k` memories `persona_id` may read closest to `text`, with their embedding
        cosine, closest first; only those at `min_cosine` or closer
        (`memory.protocols.FindsNeighbours`).

        What the near-duplicate check compares a new fact with: the text is embedded as it
        is written (no owner reading), and ranked without fusion or decay. Its vector is
        kept with the recent queries', so storing the same text next does not embed it again.
        Records are read only for the hits at `min_cosine` or closer: a query that returns
        distances alone costs about half.
        """
        if not text.strip() or k <= 0:
            return []
        reader = clean_text(persona_id) if persona_id else None
        vector = self.embedding_function.embed_query([clean_text(text)])[0]

        def close(collection: Collection) -> builtins.list[tuple[MemoryItem, float]]:
            return closest(collection, [vector], self._documents, k, min_cosine)[0]

        readable = self._readable(reader, False)
        found = [hit for hits in self._bucket_pool.map(close, readable) for hit in hits]
        found = [hit for hit in found if may_read(hit[0], reader, False)]
        found.sort(key=lambda hit: hit[1], reverse=True)
        return found[:k]

    def similarities(self, text: str, others: Sequence[str]) -> builtins.list[float]:
        """The embedding cosine of `text` with each of `others`."""
        return cosines(self.embedding_function, text, others)

    def _lexical_side(
        self, asked: Sequence[str], collections: dict[str, Collection], n: int
    ) -> dict[str, builtins.list[str]]:
        """The `n` best records by BM25 among these buckets alone: bucket → ids, best first."""
        if self._others_may_write():
            for bucket, collection in collections.items():
                self._lexical.follow(bucket, collection, self._documents)
        return self._lexical.search(asked, builtins.list(collections), n)

    def _candidates(
        self,
        collections: dict[str, Collection],
        vector: Any,
        lexical: dict[str, builtins.list[str]],
        n: int,
    ) -> builtins.list[Candidate]:
        """The `n` nearest records of each of these buckets and the lexical side's best
        (`_lexical_side`), with their words and distances (`memory.retrieval.candidates`).
        Each bucket's two Chroma calls run in one task on the pool: one hand-off a bucket."""

        def distances(bucket: str) -> dict[str, float]:
            near = nearest_distances(collections[bucket], vector, n)
            more = [i for i in lexical.get(bucket, ()) if i not in near]
            if more:
                near = {**near, **stored_distances(collections[bucket], more, vector)}
            return near

        def words(bucket: str, ids: Sequence[str]) -> dict[str, str]:
            texts = {i: t for i in ids if (t := self._lexical.text(i)) is not None}
            unknown = [i for i in ids if i not in texts]
            if unknown:
                texts.update(stored_texts(collections[bucket], unknown, self._documents))
            return texts

        found = []
        for bucket, near in zip(
            collections, self._bucket_pool.map(distances, collections), strict=True
        ):
            texts = words(bucket, builtins.list(near))
            found += [Candidate(bucket, i, texts[i], d) for i, d in near.items() if i in texts]
        return found

    def _others_may_write(self) -> bool:
        """Whether another client may change these buckets behind this handle's lexical
        index: a Chroma server's, or another handle of this process on the same folder
        (no other process can: `memory.storage.lock`). Asking Chroma for a bucket's count
        costs ~4 ms, on the search's path once a second."""
        return self._lock is None or self._lock.shared

    def _readable(self, reader: str | None, restricted: bool) -> builtins.list[Collection]:
        """The existing buckets the reader may read. Each is then read side by side (the
        pool): Chroma releases the GIL while it searches (at 100k items a search went from
        12.7 to 8.4 ms, median)."""
        return [
            c
            for bucket in self.readable_buckets(reader, restricted)
            if (c := self._collection(bucket, create=False)) is not None
        ]


def _bucket(collection: Collection) -> str:
    return str(collection.metadata["bucket"])
