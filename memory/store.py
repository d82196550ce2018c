"""`MemoryStore`: scoped long-term memory in Chroma, embedded or served.

One collection per scope bucket — `persona_<id>`, `user`, `project` — instead
of one collection filtered by `$or`: measured ~10× faster at 20k items, and
isolation becomes structural, because a restricted read never opens a persona
collection and persona P's read never opens persona Q's.

    store = MemoryStore.open("./.cyrene/memory")            # embedded, one process
    store = MemoryStore.connect(host="127.0.0.1", port=8000) # a `chroma run` server
"""

from __future__ import annotations

import builtins
import hashlib
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import chromadb
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.config import Settings
from chromadb.errors import NotFoundError

from memory.embedding import HashingEmbedding
from memory.items import MemoryItem, Scope, bucket_name
from memory.ranking import Decay, SearchResult, rank

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$")
_SHARED_BUCKETS = (Scope.USER.value, Scope.PROJECT.value)
_BATCH = 2_000


def collection_name(bucket: str) -> str:
    """A Chroma-legal collection name for a bucket (persona ids may be any text)."""
    if _SAFE_NAME.match(bucket):
        return bucket
    digest = hashlib.sha256(bucket.encode()).hexdigest()[:24]
    return f"persona_x{digest}"


def _settings() -> Settings:
    return Settings(anonymized_telemetry=False)


class MemoryStore:
    """Scoped memories with relevance × decay search."""

    def __init__(
        self,
        client: ClientAPI,
        *,
        embedding_function: Any = None,
        decay: Decay | None = None,
        min_relevance: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.embedding_function = embedding_function or HashingEmbedding()
        self.decay = decay or Decay()
        self.min_relevance = min_relevance
        self.clock = clock
        self._collections: dict[str, Collection] = {}
        # A search reads at most three buckets: the persona's, user and project.
        self._bucket_pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="cyrene-memory")

    @classmethod
    def open(cls, path: str | Path, embedding_function: Any = None, **options: Any) -> MemoryStore:
        """An embedded store under `path` (Chroma's embedded mode: one process at a time)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        client = chromadb.PersistentClient(path=str(path), settings=_settings())
        return cls(client, embedding_function=embedding_function, **options)

    @classmethod
    def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 8000,
        embedding_function: Any = None,
        **options: Any,
    ) -> MemoryStore:
        """A store on a Chroma server (`chroma run`), same API as `open`."""
        client = chromadb.HttpClient(host=host, port=port, settings=_settings())
        return cls(client, embedding_function=embedding_function, **options)

    # -- collections -------------------------------------------------------
    def _collection(self, bucket: str, *, create: bool) -> Collection | None:
        if bucket in self._collections:
            return self._collections[bucket]
        name = collection_name(bucket)
        if create:
            collection = self.client.get_or_create_collection(
                name,
                embedding_function=self.embedding_function,
                metadata={"bucket": bucket},
                configuration={"hnsw": {"space": "cosine"}},
            )
        else:
            try:
                collection = self.client.get_collection(
                    name, embedding_function=self.embedding_function
                )
            except (NotFoundError, ValueError):
                return None
        self._collections[bucket] = collection
        return collection

    def _stored(self) -> builtins.list[Collection]:
        """Every bucket collection that exists (for reads that compute no embeddings)."""
        return builtins.list(self.client.list_collections())

    def _find(self, item_id: str) -> tuple[Collection, dict[str, Any]] | None:
        for collection in self._stored():
            got = collection.get(ids=[item_id], include=["documents", "metadatas"])
            if got["ids"]:
                return collection, got
        return None

    # -- writes ------------------------------------------------------------
    def add(self, item: MemoryItem) -> str:
        """Store (or update) one memory; returns its id."""
        return self.add_many([item])[0]

    def add_many(self, items: Iterable[MemoryItem]) -> builtins.list[str]:
        """Store memories in batches, one upsert per bucket; returns their ids in order."""
        items = builtins.list(items)
        by_bucket: dict[str, builtins.list[MemoryItem]] = {}
        for item in items:
            if not isinstance(item, MemoryItem):
                raise TypeError(f"add_many: expected MemoryItem, got {type(item).__name__}")
            by_bucket.setdefault(item.bucket, []).append(item)
        for bucket, group in by_bucket.items():
            collection = self._collection(bucket, create=True)
            for start in range(0, len(group), _BATCH):
                chunk = group[start : start + _BATCH]
                collection.upsert(
                    ids=[i.id for i in chunk],
                    documents=[i.content for i in chunk],
                    metadatas=[i.metadata() for i in chunk],
                )
        return [i.id for i in items]  # type: ignore[misc]

    def forget(self, item_id: str) -> bool:
        """Delete a memory by id; True when it existed."""
        found = self._find(item_id)
        if found is not None:
            found[0].delete(ids=[item_id])
        return found is not None

    # -- reads -------------------------------------------------------------
    def get(self, item_id: str) -> MemoryItem | None:
        found = self._find(item_id)
        return _records(found[1])[0] if found is not None else None

    def list(
        self, *, scope: Scope | str | None = None, persona_id: str | None = None
    ) -> builtins.list[MemoryItem]:
        """Every stored memory, optionally of one scope / persona, oldest first."""
        scope = Scope(scope) if scope is not None else None
        items: builtins.list[MemoryItem] = []
        for collection in self._stored():
            items.extend(_records(collection.get(include=["documents", "metadatas"])))
        items = [
            i
            for i in items
            if (scope is None or i.scope is scope)
            and (persona_id is None or i.persona_id == persona_id)
        ]
        return sorted(items, key=lambda i: i.created_at)

    def readable_buckets(self, persona_id: str | None, restricted: bool) -> builtins.list[str]:
        """DESIGN §4 read set: P's persona scope ∪ user ∪ project; restricted → user ∪ project."""
        if restricted or not persona_id:
            return list(_SHARED_BUCKETS)
        return [bucket_name(Scope.PERSONA, persona_id), *_SHARED_BUCKETS]

    def search(
        self, query: str, persona_id: str | None = None, restricted: bool = False, k: int = 8
    ) -> builtins.list[SearchResult]:
        """The `k` most relevant readable memories, ranked by relevance × decay."""
        if not query.strip() or k <= 0:
            return []
        embedding = self.embedding_function.embed_query([query])
        buckets = self.readable_buckets(persona_id, restricted)
        collections = [c for b in buckets if (c := self._collection(b, create=False)) is not None]

        def nearest(collection: Collection) -> builtins.list[tuple[MemoryItem, float]]:
            # Oversample so that decay can reorder; Chroma caps n_results at the count.
            found = collection.query(
                query_embeddings=embedding,
                n_results=k * 2,
                include=["documents", "metadatas", "distances"],
            )
            first_query = {key: found[key][0] for key in ("ids", "documents", "metadatas")}
            return builtins.list(zip(_records(first_query), found["distances"][0], strict=True))

        # Chroma releases the GIL while it searches, so the buckets are queried
        # side by side: at 100k items a search went from 12.7 to 8.4 ms (median).
        candidates = [hit for hits in self._bucket_pool.map(nearest, collections) for hit in hits]
        return rank(
            candidates, now=self.clock(), decay=self.decay, k=k, min_relevance=self.min_relevance
        )


def _records(got: dict[str, Any]) -> builtins.list[MemoryItem]:
    """MemoryItems from a Chroma `get` result (ids, documents, metadatas)."""
    return [
        MemoryItem.from_record(i, d, m)
        for i, d, m in zip(got["ids"], got["documents"], got["metadatas"], strict=True)
    ]
