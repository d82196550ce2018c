"""Chroma records ↔ `MemoryItem`s: reading results, writing batches, the read guard.

Plain functions over one collection each; `MemoryStore` decides which
collections to touch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any

from chromadb.api.models.Collection import Collection

from memory.items import MemoryItem, Scope
from memory.storage.sealing import Documents

Embed = Callable[[list[str]], Any]
"""The store's embedding of documents (Chroma is given vectors: it cannot embed sealed text)."""

log = logging.getLogger("cyrene.memory")

ALIAS_OF = "alias_of"
"""The metadata key of an alias record: a superseded memory's words, which find its
successor (`memory.retrieval.aliases`). An alias is no memory: `records` skips it."""


def is_alias(meta: Mapping[str, Any] | None) -> bool:
    """Whether a record's metadata is an alias's."""
    return meta is not None and ALIAS_OF in meta


def may_read(item: MemoryItem, reader: str | None, restricted: bool) -> bool:
    """The second guard: a persona memory reaches only its own persona, never a restricted read.

    The collection layout already ensures this; a record that fails here was
    put somewhere it does not belong, and is dropped loudly.
    """
    if item.scope is not Scope.PERSONA:
        return True
    if not restricted and reader is not None and item.persona_id == reader:
        return True
    log.warning(
        "memory %s of persona %r dropped from a read by %r", item.id, item.persona_id, reader
    )
    return False


def upsert_each(
    collection: Collection, chunk: list[MemoryItem], documents: Documents, embed: Embed
) -> list[tuple[MemoryItem, BaseException]]:
    """Write a chunk; if Chroma refuses it, write item by item. Returns the items that failed."""
    try:
        write(collection, chunk, documents, embed)
        return []
    except Exception as exc:
        if len(chunk) == 1:
            return [(chunk[0], exc)]
    failed: list[tuple[MemoryItem, BaseException]] = []
    for item in chunk:
        try:
            write(collection, [item], documents, embed)
        except Exception as exc:
            failed.append((item, exc))
    return failed


PAGE = 5_000
"""Memories read per `get`: Chroma reads a whole collection's metadata in one SQL
statement with a variable per id, which SQLite refuses past 32,766."""


def pages(
    collection: Collection, include: list[Any], size: int = PAGE
) -> Iterator[Mapping[str, Any]]:
    """A collection's records, `size` at a time (`get` with `include`)."""
    for offset in range(0, collection.count(), size):
        yield collection.get(limit=size, offset=offset, include=include)


def every_item(collection: Collection, documents: Documents) -> list[MemoryItem]:
    """Every memory of a collection, read a page at a time."""
    return [
        item
        for page in pages(collection, ["documents", "metadatas"])
        for item in records(page, documents)
    ]


def write(
    collection: Collection, items: list[MemoryItem], documents: Documents, embed: Embed
) -> None:
    """One upsert of items with distinct ids (Chroma refuses a batch that repeats one): their
    text sealed (`memory.storage.sealing`), so their vectors are given too."""
    ids, texts = [item_key(i) for i in items], [i.content for i in items]
    collection.upsert(
        ids=ids,
        documents=documents.seal(ids, texts),
        embeddings=embed(texts),
        metadatas=[i.metadata() for i in items],
    )


def prune(collection: Collection, written: Mapping[str, Set[str]]) -> tuple[list[str], list[str]]:
    """Delete the items of these extractions (key → the ids its latest run wrote) that
    the latest run did not write; the ids of those that went, and of their aliases."""
    where: Any = {"source_extraction": {"$in": list(written)}}
    got: Mapping[str, Any] = collection.get(where=where, include=["metadatas"])
    stale = [
        item_id
        for item_id, meta in zip(got["ids"], got["metadatas"], strict=True)
        if item_id not in written.get(str((meta or {}).get("source_extraction")), ())
    ]
    if not stale:
        return [], []
    collection.delete(ids=stale)
    pointing: Any = {ALIAS_OF: {"$in": stale}}
    aliases = collection.get(where=pointing, include=[])["ids"]
    if aliases:
        collection.delete(ids=aliases)  # the words they held as aliases
    return stale, aliases


def closest(
    collection: Collection,
    vectors: Sequence[Any],
    documents: Documents,
    k: int,
    min_cosine: float = -1.0,
) -> list[list[tuple[MemoryItem, float]]]:
    """Each vector's `k` closest memories in the collection at `min_cosine` or closer, with
    their cosine, closest first: one query for all the vectors, one read of the records
    they found, none of the records beyond `min_cosine` (a query that returns distances
    alone costs about half). `records` skips aliases (an old fact's words are no copy of
    what replaced them), so a vector whose rows they filled is asked again for more."""
    found: list[list[tuple[MemoryItem, float]]] = [[] for _ in vectors]
    asking, n = list(range(len(vectors))), k
    while asking and k > 0:
        got: Mapping[str, Any] = collection.query(
            query_embeddings=[vectors[i] for i in asking], n_results=n, include=["distances"]
        )
        rows = dict(zip(asking, got["distances"], strict=True))
        close = {
            i: {r: 1.0 - d for r, d in zip(ids, rows[i], strict=True) if 1.0 - d >= min_cosine}
            for i, ids in zip(asking, got["ids"], strict=True)
        }
        wanted = sorted({r for near in close.values() for r in near})
        if not wanted:  # (a `get` of no ids reads the whole collection)
            break
        read = collection.get(ids=wanted, include=["documents", "metadatas"])
        items = {item_key(item): item for item in records(read, documents)}
        again = []
        for i in asking:
            found[i] = [(items[r], cosine) for r, cosine in close[i].items() if r in items]
            # Enough, or nothing closer is left: every row read, or some too far.
            if len(found[i]) < k and len(rows[i]) == n and len(close[i]) == n:
                again.append(i)
        asking, n = again, n * 4
    for hits in found:
        hits.sort(key=lambda hit: hit[1], reverse=True)
    return found


def records(got: Mapping[str, Any], documents: Documents) -> list[MemoryItem]:
    """MemoryItems from a Chroma `get` result (ids, documents, metadatas); aliases, and
    records whose text is gone (forgotten), skipped."""
    texts = documents.unseal(got["ids"], got["documents"])
    return [
        MemoryItem.from_record(i, text, m or {})
        for i, text, m in zip(got["ids"], texts, got["metadatas"], strict=True)
        if not is_alias(m) and text is not None
    ]


def item_key(item: MemoryItem) -> str:
    """The item's id (its validator always sets one; typed optional for input only)."""
    return item.id or item.content_id()
