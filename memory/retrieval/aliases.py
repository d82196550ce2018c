"""A superseded fact's words still find what replaced it.

The owner asks about a fact in the words of its old version as often as in
the new one's ("我的号码是联通的吗？" after "主人已经把手机号转到了移动"
replaced "主人用的是联通的手机卡"). So when a memory is superseded by one in
the same bucket, its text stays in the bucket's index as an *alias* of its
successor: a record `alias:<old id>` whose metadata names the successor
(`alias_of`). A search reads a hit on an alias as a hit on the successor
(`MemoryStore.search` keeps the better of the two matches); the alias's text
is never returned, listed or exported, and the near-duplicate check ignores it
(restating an old fact is not a duplicate of its replacement). On the update
pairs of `tests/data/memory_recall.jsonl` the new fact came first for 21 of
32 questions without aliases and for 25 with them (`python -m tests.bench.memory`).

Aliases follow the chain (when the successor is superseded in turn, they
point to the newest), go with it when it is forgotten, and are re-embedded with
their bucket. A successor in another bucket gets none: the alias would carry
one bucket's words into another's index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chromadb.api.models.Collection import Collection

from memory.items import RESERVED_ID_PREFIX, MemoryItem
from memory.storage.records import ALIAS_OF, is_alias, item_key, records
from memory.storage.sealing import Documents


def alias_id(item_id: str) -> str:
    """The id of the alias that memory `item_id`'s words leave behind."""
    return f"{RESERVED_ID_PREFIX}{item_id}"


def resolve(
    collection: Collection, got: Mapping[str, Any], documents: Documents
) -> dict[str, MemoryItem]:
    """The memory each record of a `get` (ids, documents, metadatas) stands for: itself, or an
    alias's successor. A record whose text is gone, or an alias whose successor went, stands
    for none."""
    items = {item_key(item): item for item in records(got, documents)}
    aliases = [(i, m) for i, m in zip(got["ids"], got["metadatas"], strict=True) if is_alias(m)]
    missing = list({_successor(m) for _, m in aliases} - set(items))
    if missing:
        more = collection.get(ids=missing, include=["documents", "metadatas"])
        items.update((item_key(item), item) for item in records(more, documents))
    found = {i: items[i] for i in got["ids"] if i in items}
    if aliases:
        sealed = dict(zip(got["ids"], got["documents"], strict=True))
        words = documents.unseal([i for i, _ in aliases], [sealed[i] for i, _ in aliases])
        for (alias, meta), text in zip(aliases, words, strict=True):
            if text is not None and _successor(meta) in items:
                found[alias] = items[_successor(meta)]
    return found


def leave_alias(
    collection: Collection, old: MemoryItem, successor: MemoryItem, documents: Documents
) -> tuple[str | None, list[str]]:
    """Before `old` leaves `collection` for `successor`: its words, and those of the aliases
    that pointed to it, point to `successor` (or, in another bucket, go). Returns the alias
    written (None in another bucket) and the aliases deleted, for the lexical index."""
    pointing = collection.get(where={ALIAS_OF: item_key(old)}, include=[])["ids"]
    if successor.bucket != old.bucket:
        if pointing:
            collection.delete(ids=pointing)
        return None, pointing
    meta = {**_owner(successor), ALIAS_OF: item_key(successor)}
    if pointing:  # their words and vectors stay; only what they point to changes
        collection.update(ids=pointing, metadatas=[meta] * len(pointing))
    # The old memory's stored vector, not a new embedding of its words.
    vector = collection.get(ids=[item_key(old)], include=["embeddings"])["embeddings"]
    alias = alias_id(item_key(old))
    collection.upsert(
        ids=[alias],
        documents=documents.seal([alias], [old.content]),
        embeddings=vector,
        metadatas=[meta],
    )
    return alias, []


def drop_aliases(collection: Collection, ids: Sequence[str]) -> list[str]:
    """Delete the aliases these memories' words left and those that point to them; the ids
    whose text a forget must make unreadable (an alias of theirs deleted earlier, when its
    chain moved to another bucket, included)."""
    own = [alias_id(i) for i in ids]
    pointing: Any = {ALIAS_OF: {"$in": list(ids)}}
    gone = list(dict.fromkeys([*own, *collection.get(where=pointing, include=[])["ids"]]))
    collection.delete(ids=gone)
    return gone


def _successor(meta: Mapping[str, Any] | None) -> str:
    return str((meta or {})[ALIAS_OF])


def _owner(item: MemoryItem) -> dict[str, Any]:
    """The bucket fields of an alias: whose words they are, for the layout's owner checks."""
    meta = item.metadata()
    return {key: meta[key] for key in ("scope", "persona_id") if key in meta}
