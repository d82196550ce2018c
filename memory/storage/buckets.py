"""A store's bucket collections: which Chroma collection holds a bucket, found or made on
demand and cached, and writes spread over them.

One collection per scope bucket — `persona_<id>`, `user`, `project` — instead of one
collection filtered by `$or`: measured ~10× faster at 20k items, and isolation becomes
structural, because a restricted read never opens a persona collection and persona P's
read never opens persona Q's. Bucket names map to collection names injectively
(`memory.storage.layout`). `memory.storage.records` reads and writes within one
collection; this decides which, so `MemoryStore` keeps only its facade.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from memory.items import MemoryItem
from memory.storage.layout import bucket_metadata, check_owner, collection_name, ours
from memory.storage.records import item_key, records, upsert_each
from memory.storage.sealing import Documents

_BATCH = 2_000
# A bucket found missing is looked for again after this long (another store handle or
# process may create it); asking Chroma for it on every search cost ~5% of a busy
# process's CPU.
_MISSING_RECHECK = 1.0

Indexed = Callable[[str, Sequence[str], Sequence[str]], None]
"""Told of each stored batch: its bucket, ids and texts (the store's lexical index)."""


class Buckets:
    """The bucket → collection cache of one store; `live` raises once the store is closed.
    How text is kept (`Documents`) is the store's, asked for on each call."""

    def __init__(
        self,
        client: ClientAPI,
        embedding_function: Any,
        live: Callable[[], None],
    ) -> None:
        self.client = client
        self.embedding_function = embedding_function
        self.live = live
        self.cached: dict[str, Collection] = {}
        self.missing: dict[str, float] = {}  # bucket → when it was found missing

    def forget_cached(self) -> None:
        """Drop every cached collection and missing mark (a rebuild made new ones)."""
        self.cached.clear()
        self.missing.clear()

    def collection(self, bucket: str, *, create: bool) -> Collection | None:
        self.live()
        if bucket in self.cached:
            return self.cached[bucket]
        missing_since = self.missing.get(bucket)
        if not create and missing_since and time.monotonic() - missing_since < _MISSING_RECHECK:
            return None
        name = collection_name(bucket)
        if create:
            collection = self.client.get_or_create_collection(
                name,
                embedding_function=self.embedding_function,
                metadata=bucket_metadata(bucket),
                configuration={"hnsw": {"space": "cosine"}},
            )
        else:
            try:
                collection = self.client.get_collection(
                    name, embedding_function=self.embedding_function
                )
            except (NotFoundError, ValueError):
                self.missing[bucket] = time.monotonic()
                return None
        self.missing.pop(bucket, None)
        self.cached[bucket] = check_owner(collection, bucket)
        return collection

    def stored(self) -> list[Collection]:
        """Every bucket collection that exists (for reads that compute no embeddings)."""
        self.live()
        return [c for c in self.client.list_collections() if ours(c)]

    def stored_ids(self, ids: list[str]) -> set[str]:
        """Which of these ids are live memories (in any bucket)."""
        if not ids:
            return set()
        return {i for c in self.stored() for i in c.get(ids=ids, include=[])["ids"]}

    def find(
        self, item_id: str, documents: Documents
    ) -> tuple[Collection, Mapping[str, Any]] | None:
        for collection in self.stored():
            got = collection.get(ids=[item_id], include=["documents", "metadatas"])
            if records(got, documents):  # a memory, not an alias (`memory.retrieval.aliases`)
                return collection, got
        return None

    def upsert(
        self, items: Iterable[MemoryItem], documents: Documents, indexed: Indexed
    ) -> list[tuple[MemoryItem, BaseException]]:
        """Store checked items, one upsert per bucket and batch (a refused batch is retried
        item by item: `upsert_each`); what could not be stored, with why."""
        by_bucket: dict[str, list[MemoryItem]] = {}
        for item in items:
            by_bucket.setdefault(item.bucket, []).append(item)
        failed: list[tuple[MemoryItem, BaseException]] = []
        for bucket, group in by_bucket.items():
            collection = self.collection(bucket, create=True)
            assert collection is not None  # create=True always yields one
            for start in range(0, len(group), _BATCH):
                chunk = group[start : start + _BATCH]
                refused = upsert_each(collection, chunk, documents, self.embedding_function)
                bad = {item_key(item) for item, _ in refused}
                stored = [item for item in chunk if item_key(item) not in bad]
                indexed(bucket, [item_key(i) for i in stored], [i.content for i in stored])
                failed += refused
        return failed
