"""Bucket → Chroma collection names, injective, and the migration from the old layout.

Chroma names are 3-512 characters of `[A-Za-z0-9._-]`, start and end
alphanumeric, with no `..`; persona ids may be any text. Three disjoint forms,
told apart by the character after `persona`, so no two ids share a collection:

- `persona_<id>`  an id that is already a legal tail (the common case; unchanged
  from the old layout, so such stores need no migration);
- `persona-<hex>` any other id: the hex of its UTF-8 bytes, reversible;
- `persona.<sha256>` an id too long for either: the raw id is recorded in the
  collection's metadata and checked whenever the collection is opened.

The old layout hashed non-legal ids to `persona_x<24 hex>`, the very form a
legal id like `xc67164fe21a1db39121d8617` takes (issue 12: two personas shared
a private collection). `migrate` moves every record of an old store into the
collection its own persona names, once; collections it has checked carry
`layout: 2` in their metadata.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from memory.errors import StoreLayoutError
from memory.items import UNOWNED_PERSONA_BUCKET, MemoryItem, Scope
from memory.storage.records import pages

log = logging.getLogger("cyrene.memory")

LAYOUT = 2
_PERSONA = "persona_"
_SHARED = frozenset({Scope.USER.value, Scope.PROJECT.value})
_MAX_NAME = 512
_LEGAL_TAIL = re.compile(r"^[A-Za-z0-9._-]*[A-Za-z0-9]$")
_PAGE = 2_000
_OLD_HASHED = re.compile(r"^persona_x[0-9a-f]{24}$")


def collection_name(bucket: str) -> str:
    """The Chroma collection of a bucket (`user`, `project` or `persona_<any text>`)."""
    if bucket in _SHARED:
        return bucket
    if not bucket.startswith(_PERSONA) or bucket == _PERSONA:
        raise ValueError(f"not a storable bucket: {bucket!r}")
    persona = bucket[len(_PERSONA) :]
    if _LEGAL_TAIL.match(persona) and ".." not in persona and len(bucket) <= _MAX_NAME:
        return bucket
    raw = persona.encode("utf-8", "surrogatepass")  # total over str: injective
    if len("persona-") + 2 * len(raw) <= _MAX_NAME:
        return f"persona-{raw.hex()}"
    return f"persona.{hashlib.sha256(raw).hexdigest()}"


def bucket_metadata(bucket: str) -> dict[str, Any]:
    """What a bucket's collection records about itself (checked by `check_owner`)."""
    return {"bucket": bucket, "layout": LAYOUT}


def check_owner(collection: Collection, bucket: str) -> Collection:
    """`collection`, after checking that it records `bucket` (a hashed name could collide).

    Raises:
        StoreLayoutError: the collection belongs to another bucket.
    """
    recorded = (collection.metadata or {}).get("bucket")
    if recorded != bucket:
        raise StoreLayoutError(
            f"memory collection {collection.name!r} holds bucket {recorded!r}, not {bucket!r}; "
            "refusing to read or write it"
        )
    return collection


def ours(collection: Collection) -> bool:
    """Whether a collection is one of this store's buckets (a server may host others)."""
    return "bucket" in (collection.metadata or {})


def migrate(client: ClientAPI, embedding_function: Any) -> int:
    """Bring every collection to the current layout; returns how many records moved.

    Only a collection the old layout could have shared between personas (a
    hashed `persona_x<24 hex>` name, or a name its bucket no longer maps to)
    is read: each of its records goes to the collection its own scope and
    persona name. Every other collection is only marked. Idempotent, and
    cheap once done: marked collections are skipped.
    """
    moved = 0
    for collection in client.list_collections():
        meta = collection.metadata or {}
        if not ours(collection) or meta.get("layout") == LAYOUT:
            continue
        try:
            if _may_hold_strays(collection):
                moved += _migrate_one(client, collection, embedding_function)
            else:
                collection.modify(metadata=bucket_metadata(meta["bucket"]))
        except NotFoundError:
            continue  # another client (a server's other worker) migrated it first
    if moved:
        log.warning("memory store migrated to layout %d: %d records moved", LAYOUT, moved)
    return moved


def _names(bucket: str, name: str) -> bool:
    """Whether `name` is the collection of `bucket` (False for a bucket that has none)."""
    try:
        return collection_name(bucket) == name
    except ValueError:
        return False


def _may_hold_strays(collection: Collection) -> bool:
    """Only the old hashed names could be taken by two personas at once."""
    return bool(_OLD_HASHED.match(collection.name)) or not _names(
        collection.metadata["bucket"], collection.name
    )


def _sole_owner(client: ClientAPI, collection: Collection) -> bool:
    """Whether every record is its bucket's and that bucket's new name is free (so rename)."""
    named = collection.metadata["bucket"]
    try:
        target = collection_name(named)
    except ValueError:  # not a bucket this store writes
        return False
    if any(c.name == target for c in client.list_collections()):
        return False
    for page in pages(collection, ["metadatas"], _PAGE):
        for item_id, meta in zip(page["ids"], page["metadatas"], strict=True):
            if MemoryItem.from_record(item_id, "-", meta or {}).bucket != named:
                return False
    return True


def _migrate_one(client: ClientAPI, collection: Collection, embedding_function: Any) -> int:
    """Rename a collection that only its own bucket used; else move out the records that
    belong elsewhere, then mark or drop the collection."""
    named = collection.metadata["bucket"]
    if not _names(named, collection.name) and _sole_owner(client, collection):
        collection.modify(name=collection_name(named), metadata=bucket_metadata(named))
        return collection.count()
    stays: str | None = None
    moved = offset = 0
    while True:
        page: Mapping[str, Any] = collection.get(
            limit=_PAGE, offset=offset, include=["documents", "metadatas", "embeddings"]
        )
        if not page["ids"]:
            break
        away: dict[str, list[int]] = {}
        for index, (item_id, document, meta) in enumerate(
            zip(page["ids"], page["documents"], page["metadatas"], strict=True)
        ):
            bucket = MemoryItem.from_record(item_id, document, meta or {}).bucket
            if _names(bucket, collection.name):
                stays = bucket
            elif bucket != UNOWNED_PERSONA_BUCKET:  # an ownerless record no read ever shows
                away.setdefault(bucket, []).append(index)
        for bucket, rows in away.items():
            target = client.get_or_create_collection(
                collection_name(bucket),
                embedding_function=embedding_function,
                metadata=bucket_metadata(bucket),
                configuration={"hnsw": {"space": "cosine"}},
            )
            target.upsert(
                ids=[page["ids"][r] for r in rows],
                documents=[page["documents"][r] for r in rows],
                metadatas=[page["metadatas"][r] for r in rows],
                embeddings=[page["embeddings"][r] for r in rows],
            )
            collection.delete(ids=[page["ids"][r] for r in rows])
            moved += len(rows)
        offset += len(page["ids"]) - sum(len(rows) for rows in away.values())
    if stays is None and _names(named, collection.name):
        stays = named  # empty, or every record moved, but the name is right for its bucket
    if stays is None:
        client.delete_collection(collection.name)
    else:
        collection.modify(metadata=bucket_metadata(stays))
    return moved
