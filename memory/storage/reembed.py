"""Re-embedding: a store written with another embedding is detected on open and rebuilt in place.

Chroma records in each collection the embedding function that wrote it (its
registered name and config). Vectors of two models are not comparable, so a
collection whose record differs from the store's embedding is never searched
or written as it is: its records (ids, documents, metadata) are copied page by
page into a staging collection, `reembed.<sha256 of its name>`, that embeds
them with the store's function; once every id is there, the old collection is
dropped and the staging one takes its name and metadata.

Crash-safe without a journal: until the drop the old collection is whole, and
the next open resumes the copy (ids already staged are skipped); after the
drop the staging collection is complete, and the next open finishes the
rename. Nothing is lost, and no collection ever holds vectors of two models.
With a Chroma server, re-embed (open once, or `cyrene memory reindex`) before
workers with the new embedding start writing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError
from chromadb.utils.embedding_functions import config_to_embedding_function

from memory.errors import MemoryStoreError
from memory.storage.layout import ours
from memory.storage.sealing import Documents

log = logging.getLogger("cyrene.memory")

Progress = Callable[[str, int, int], None]
"""Called as re-embedding goes: (collection name, records done, records in it)."""

STAGING = "reembed."
_PAGE = 500


def written_with(collection: Collection, embedding_function: Any) -> bool:
    """Whether Chroma recorded `embedding_function` (same name and config) for the collection."""
    recorded = (collection.configuration_json or {}).get("embedding_function") or {}
    return (
        recorded.get("type") == "known"
        and recorded.get("name") == embedding_function.name()
        and recorded.get("config") == embedding_function.get_config()
    )


def reembed_store(
    client: ClientAPI,
    embedding_function: Any,
    documents: Documents,
    *,
    everything: bool = False,
    progress: Progress | None = None,
) -> int:
    """Finish interrupted re-embeds, then re-embed each memory collection written with
    another embedding (every one when `everything`). Returns how many records it embedded.

    An embedding function that cannot describe itself (no registered name and
    config: Chroma calls it legacy) cannot be compared, so nothing is checked.

    Raises:
        MemoryStoreError: records did not reach the staging collection (the old one is kept).
    """
    if _is_legacy(embedding_function):
        log.warning(
            "memory embedding %r has no name/config: stores are not checked for it",
            type(embedding_function).__name__,
        )
        return 0
    collections = client.list_collections()
    names = {c.name for c in collections}
    for staged in collections:  # a crash between dropping the old copy and the rename
        if staged.name.startswith(STAGING) and _target(staged) not in names:
            _take_over(staged)
    embedded = 0
    for collection in client.list_collections():
        if ours(collection) and (everything or not written_with(collection, embedding_function)):
            embedded += _reembed(client, collection, embedding_function, documents, progress)
    return embedded


def _is_legacy(embedding_function: Any) -> bool:
    try:
        return bool(embedding_function.is_legacy())
    except Exception:
        return True


def _target(staged: Collection) -> str:
    return str((staged.metadata or {}).get("reembed_of", ""))


def rebuild(client: ClientAPI, source: Collection) -> int:
    """Copy `source` into a new collection with its own vectors (not embedded anew) and
    swap it in: its vector index files are written afresh (`memory.storage.clear_text`)."""
    recorded = (source.configuration_json or {}).get("embedding_function")
    function = config_to_embedding_function(recorded) if recorded else None
    return _reembed(client, source, function, None, None)


def _reembed(
    client: ClientAPI,
    source: Collection,
    embedding_function: Any,
    documents: Documents | None,
    progress: Progress | None,
) -> int:
    """Copy `source` into its staging collection, embedding anew (or, without `documents`,
    with the vectors it has), then swap it in."""
    recorded = (source.configuration_json or {}).get("embedding_function") or {}
    total = source.count()
    if documents is not None:
        log.warning(
            "re-embedding memory collection %r (%d records, written with %s) with %s",
            source.name, total, recorded.get("name", "an unrecorded embedding"),
            embedding_function.name(),
        )  # fmt: skip
    staging = _staging(client, source, embedding_function)
    staged = set(staging.get(include=[])["ids"])
    unreadable: set[str] = set()  # sealed text whose key a forget destroyed: dropped
    for offset in range(0, total, _PAGE):
        wanted: Any = ["documents", "metadatas", *(["embeddings"] if documents is None else [])]
        page: Mapping[str, Any] = source.get(limit=_PAGE, offset=offset, include=wanted)
        if documents is None:  # a rebuild: the vectors as they are
            texts, vectors = page["documents"], list(page["embeddings"])
        else:
            texts = documents.unseal(page["ids"], page["documents"])
            unreadable.update(i for i, text in zip(page["ids"], texts, strict=True) if text is None)
        rows = [
            i
            for i, item_id in enumerate(page["ids"])
            if item_id not in staged and (documents is None or texts[i] is not None)
        ]
        if rows:  # the document copied as it is (sealed or not), the vector new or kept
            staging.upsert(
                ids=[page["ids"][i] for i in rows],
                documents=[page["documents"][i] for i in rows],
                embeddings=(
                    [vectors[i] for i in rows]
                    if documents is None
                    else embedding_function([texts[i] for i in rows])
                ),
                metadatas=[page["metadatas"][i] for i in rows],
            )
        if progress is not None:
            progress(source.name, min(offset + len(page["ids"]), total), total)
    missing = set(source.get(include=[])["ids"]) - set(staging.get(include=[])["ids"]) - unreadable
    if missing:
        raise MemoryStoreError(
            f"re-embedding {source.name!r}: {len(missing)} records did not reach the new "
            "collection; the old one is kept, open the store again to retry"
        )
    with contextlib.suppress(NotFoundError):  # another client of the server dropped it first
        client.delete_collection(source.name)
    _take_over(staging)
    return total


def _staging(client: ClientAPI, source: Collection, embedding_function: Any) -> Collection:
    """The staging collection of `source`, resumed if an earlier run left it."""
    name = STAGING + hashlib.sha256(source.name.encode("utf-8")).hexdigest()
    space = ((source.configuration_json or {}).get("hnsw") or {}).get("space", "cosine")

    def get_or_create() -> Collection:
        return client.get_or_create_collection(
            name,
            embedding_function=embedding_function,
            metadata={
                "reembed_of": source.name,
                "reembed_metadata": json.dumps(source.metadata or {}),
            },
            configuration={"hnsw": {"space": space}},
        )

    try:
        return get_or_create()
    except ValueError:  # left by a run with yet another embedding: start over
        client.delete_collection(name)
        return get_or_create()


def _take_over(staged: Collection) -> None:
    """Give a complete staging collection its source's name and metadata."""
    metadata = json.loads(str((staged.metadata or {}).get("reembed_metadata", "{}")))
    with contextlib.suppress(NotFoundError):  # another client of the server renamed it first
        staged.modify(name=_target(staged), metadata=metadata or None)
