"""What became of a memory: superseded (and by what, when) or forgotten (when).

A superseded memory leaves its bucket, so search never finds it and the
memory block never shows it again, and is kept here, whole, with
`superseded_at` and `superseded_by` (Graphiti keeps a contradicted fact with
`invalid_at` the same way; mem0 keeps a history table). A forgotten memory
leaves only a tombstone: its id, scope, persona and time, never its text, and the id
of the message it was extracted from (`Source.message_id`), so the model's view can leave
that turn out (`ForgottenTurns`). A fact said again in a later turn is not stored twice
(`memory.lifecycle.duplicates`); that turn is linked to the memory (`restated`: the
memory's id and the turn's session and message ids), and a forget turns each link into a
tombstone of its own, with a random id and no trace of the memory's, so every turn that
said the fact leaves the view.
Forgetting a memory forgets the memories it replaced too, so "forget that"
leaves no older wording of the fact behind.

The records live in one Chroma collection beside the buckets
(`HISTORY_COLLECTION`, no `bucket` in its metadata, so reads, the layout
migration and re-embedding never take it for memories), one record per
memory id, read by id and by `superseded_by`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from memory.items import MemoryItem, Source
from memory.storage.sealing import Documents

HISTORY_COLLECTION = "cyrene_memory_history"
# Chroma wants a vector per record; history is only read by id and metadata.
_POINT: list[Sequence[float]] = [[1.0]]
State = Literal["live", "superseded", "forgotten"]
_SUPERSEDED: State = "superseded"
_FORGOTTEN: State = "forgotten"
_SOURCE_KEYS = ("source_session_id", "source_message_id", "source_thread_id", "source_opening_id")
"""A `Turn`'s keys in a record's metadata (a memory's `Source` has the same)."""
_STATED, _RESTATES = "stated", "restates"
"""A link's state, and its key naming the memory the turn said again."""
CHECK_INTERVAL = 1.0
"""Seconds between `ForgottenTurns`' cheap checks for another process's forgets."""
TURNS_MAX_AGE = 30.0
"""Seconds `ForgottenTurns` trusts its cheap check before it reads the tombstones again."""


@dataclass(frozen=True)
class Turn:
    """A turn a memory was said in, by ids only: as the app names it (its session, and its
    message or turn id) and as the loop ran it (the thread, and the id of the human message
    that opened it there). The loop's pair is what a view leaves out; a memory stamped before
    it was kept, or added by hand with a `Source`, has the app's only."""

    session: str | None = None
    message: str | None = None
    thread: str | None = None
    opening: str | None = None

    @classmethod
    def said(cls, source: Source) -> Turn | None:
        """The turn a memory's source names (None: it names no message)."""
        return cls(
            source.session_id, source.message_id, source.thread_id, source.opening_id
        ).named()

    @classmethod
    def recorded(cls, meta: Mapping[str, Any]) -> Turn | None:
        """The turn a record's metadata names (None: it names no message)."""
        return cls(*(str(v) if v else None for v in map(meta.get, _SOURCE_KEYS))).named()

    def named(self) -> Turn | None:
        return self if self.message or (self.thread and self.opening) else None

    def meta(self) -> dict[str, str]:
        ids = (self.session, self.message, self.thread, self.opening)
        return {key: value for key, value in zip(_SOURCE_KEYS, ids, strict=True) if value}


@dataclass(frozen=True)
class ForgottenSources:
    """The turns forgotten memories were said in: the opening message ids by thread, and,
    for tombstones that name no thread, the message ids by the app's session (None: no
    session named either)."""

    by_thread: Mapping[str, frozenset[str]]
    by_session: Mapping[str | None, frozenset[str]]

    def of(self, session_id: str | None, thread_id: str | None) -> frozenset[str]:
        """The forgotten turns a view of thread `thread_id`, run as session `session_id`,
        leaves out."""
        none: frozenset[str] = frozenset()
        return (
            self.by_thread.get(thread_id or "", none)
            | self.by_session.get(session_id, none)
            | self.by_session.get(None, none)
        )


NO_SOURCES = ForgottenSources({}, {})


@dataclass(frozen=True)
class HistoryEntry:
    """One link of a memory's chain, oldest first in `MemoryStore.history`.

    Attributes:
        item_id: the memory's id.
        state: `live` (searched and shown), `superseded` or `forgotten`.
        item: the memory (None once forgotten: its text is gone).
        at: when it was superseded or forgotten (None while live).
        superseded_by: the id of the memory that replaced it.
        scope: its scope (kept after a forget too).
    """

    item_id: str
    state: State
    item: MemoryItem | None
    at: float | None = None
    superseded_by: str | None = None
    scope: str | None = None


class History:
    """The history collection of one Chroma client."""

    def __init__(self, client: ClientAPI, documents: Documents) -> None:
        self._client = client
        self._documents = documents
        self._collection: Collection | None = None

    def records(self) -> Collection:
        if self._collection is None:
            self._collection = self._client.get_or_create_collection(
                HISTORY_COLLECTION, embedding_function=None, metadata={"cyrene": "history"}
            )
        return self._collection

    def existing(self) -> Collection | None:
        """The history collection, if a supersede or a forget has made it (None: none)."""
        if self._collection is None:
            try:
                self._collection = self._client.get_collection(HISTORY_COLLECTION)
            except (NotFoundError, ValueError):
                return None
        return self._collection

    def superseded(self, item: MemoryItem, by: str, at: float) -> None:
        """Keep `item`, replaced by the memory `by` at `at` (idempotent)."""
        meta = {**item.metadata(), "state": _SUPERSEDED, "at": at, "superseded_by": by}
        ids = [str(item.id)]
        self._keep_earlier_tombstones(ids)
        self.records().upsert(
            ids=ids,
            embeddings=_POINT,
            documents=self._documents.seal(ids, [item.content]),
            metadatas=[meta],
        )

    def forgotten(
        self,
        ids: list[str],
        scopes: Mapping[str, tuple[str, str | None]],
        at: float,
        sources: Mapping[str, Turn | None],
    ) -> None:
        """Tombstones for these ids (scope and persona from `scopes`, the turn each came from
        in `sources`): the text goes.

        A kept record is deleted before its tombstone is written, since an
        upsert without a document would keep the old one.
        """
        if not ids:
            return
        self._keep_earlier_tombstones(ids)
        self.records().delete(ids=ids)
        metas: list[Any] = [_tombstone(at, *scopes[i], sources.get(i)) for i in ids]
        self.records().add(ids=ids, embeddings=_POINT * len(ids), metadatas=metas)
        self._forget_links({i: (*scopes[i], at) for i in ids})

    def _keep_earlier_tombstones(self, ids: list[str]) -> None:
        """Before these ids' records are written again: a tombstone among them (a memory
        forgotten, then said again in the same words, so under the same id) is kept under
        an id of its own, so its turn stays forgotten."""
        earlier = self.records().get(ids=ids, where={"state": _FORGOTTEN}, include=["metadatas"])
        turns = [meta for meta in earlier["metadatas"] or [] if meta and Turn.recorded(meta)]
        if turns:
            self.records().add(
                ids=[_link_id() for _ in turns], embeddings=_POINT * len(turns), metadatas=turns
            )

    def restated(self, links: Mapping[str, Set[Turn]]) -> None:
        """Link these turns to the memory each said again (memory id → turns), once each.

        A memory forgotten meanwhile (another worker's forget, which missed the link) has
        its links made tombstones at once, at its tombstone's time."""
        links = {memory: turns for memory, turns in links.items() if turns}
        if not links:
            return
        known = {(memory, turn) for _, memory, turn in self._linked(list(links))}
        new = [(m, turn) for m, turns in links.items() for turn in turns if (m, turn) not in known]
        if new:
            metas: list[Any] = [
                {"state": _STATED, _RESTATES: memory, **turn.meta()} for memory, turn in new
            ]
            self.records().add(
                ids=[_link_id() for _ in new], embeddings=_POINT * len(new), metadatas=metas
            )
        gone = self.records().get(ids=list(links), where={"state": _FORGOTTEN})
        owners: dict[str, tuple[str, str | None, float]] = {}
        for memory, meta in zip(gone["ids"], gone["metadatas"] or [], strict=True):
            if meta and isinstance(at := meta.get("at"), int | float):
                persona = meta.get("persona_id")
                owners[memory] = (str(meta.get("scope")), str(persona) if persona else None, at)
        self._forget_links(owners)

    def _linked(self, memories: list[str]) -> list[tuple[str, str, Turn]]:
        """The links to these memories: each record's id, its memory and its turn."""
        where: Any = {"$and": [{"state": _STATED}, {_RESTATES: {"$in": memories}}]}
        got = self.records().get(where=where, include=["metadatas"])
        return [
            (record, str(meta[_RESTATES]), turn)
            for record, meta in zip(got["ids"], got["metadatas"] or [], strict=True)
            if meta and (turn := Turn.recorded(meta))
        ]

    def _forget_links(self, owners: Mapping[str, tuple[str, str | None, float]]) -> None:
        """Make the links of these forgotten memories (memory → scope, persona, when)
        tombstones: the turn is kept, the memory's id is not. Written before the links
        are deleted, so a crash between leaves a link too many, never a turn in view."""
        if not owners:
            return
        links = self._linked(list(owners))
        if not links:
            return
        metas: list[Any] = [
            _tombstone(owners[memory][2], *owners[memory][:2], turn) for _, memory, turn in links
        ]
        self.records().add(
            ids=[_link_id() for _ in links], embeddings=_POINT * len(links), metadatas=metas
        )
        self.records().delete(ids=[record for record, _, _ in links])

    def forgotten_sources(self) -> ForgottenSources:
        """The turns forgotten memories were said in: by the thread the loop ran them in,
        or, for a tombstone that names none, by the app's session; one read of the
        tombstones."""
        collection = self.existing()
        if collection is None:
            return NO_SOURCES
        got = collection.get(where={"state": _FORGOTTEN}, include=["metadatas"])
        by_thread: dict[str, set[str]] = {}
        by_session: dict[str | None, set[str]] = {}
        for turn in filter(None, map(Turn.recorded, filter(None, got["metadatas"] or []))):
            if turn.thread and turn.opening:
                by_thread.setdefault(turn.thread, set()).add(turn.opening)
            elif turn.message:
                by_session.setdefault(turn.session, set()).add(turn.message)
        return ForgottenSources(
            {thread: frozenset(ids) for thread, ids in by_thread.items()},
            {session: frozenset(ids) for session, ids in by_session.items()},
        )

    def entry(self, item_id: str) -> HistoryEntry | None:
        return self.entries([item_id]).get(item_id)

    def entries(self, ids: Sequence[str]) -> dict[str, HistoryEntry]:
        """The entries these ids have (one read), by id."""
        if not ids:
            return {}
        got = self.records().get(ids=list(dict.fromkeys(ids)), include=["documents", "metadatas"])
        return {got["ids"][n]: entry for n, entry in enumerate(self._entries(got))}

    def predecessors(self, item_id: str) -> list[HistoryEntry]:
        """The memories `item_id` directly replaced."""
        got = self.records().get(
            where={"superseded_by": item_id}, include=["documents", "metadatas"]
        )
        return self._entries(got)

    def _entries(self, got: Mapping[str, Any]) -> list[HistoryEntry]:
        texts = self._documents.unseal(got["ids"], got.get("documents") or [None] * len(got["ids"]))
        return [_entry(got, n, text) for n, text in enumerate(texts)]

    def ancestry(self, item_id: str) -> list[HistoryEntry]:
        """Every memory `item_id` replaced, directly or through others, oldest last."""
        found: list[HistoryEntry] = []
        frontier = [item_id]
        while frontier:
            older = [
                e
                for i in frontier
                for e in self.predecessors(i)
                if e.item_id not in {f.item_id for f in found}
            ]
            found += older
            frontier = [e.item_id for e in older]
        return found


def _link_id() -> str:
    """A record id of its own (a link's, or an earlier tombstone's kept beside a new one):
    random, so nothing in it says which memory it was."""
    return f"{_STATED}:{uuid.uuid4().hex}"


def _tombstone(at: float, scope: str, persona: str | None, turn: Turn | None) -> dict[str, Any]:
    """A forgotten memory's, or a forgotten memory's link's, record: no text, no words."""
    return {
        "state": _FORGOTTEN,
        "at": at,
        "scope": scope,
        **({"persona_id": persona} if persona else {}),
        **(turn.meta() if turn else {}),
    }


def _entry(got: Mapping[str, Any], n: int, text: str | None) -> HistoryEntry:
    item_id, meta = got["ids"][n], dict(got["metadatas"][n] or {})
    state: State = _FORGOTTEN if meta.get("state") == _FORGOTTEN else _SUPERSEDED
    item = MemoryItem.from_record(item_id, text, meta) if text else None
    return HistoryEntry(
        item_id=item_id,
        state=state,
        item=item,
        at=float(meta["at"]) if "at" in meta else None,
        superseded_by=meta.get("superseded_by"),
        scope=meta.get("scope"),
    )


class ForgottenTurns:
    """`History.forgotten_sources`, read again only when the history may have changed.

    Asked several times a round, so most asks cost a clock read. This process's forgets
    say so at once (`changed`). Another process's (a Chroma server's other workers) shows
    in the history collection's record count, looked at once every `CHECK_INTERVAL`
    seconds: a count holds the interpreter for ~0.5 ms. A forget of memories that all had
    history records already (superseded ones) leaves the count as it was, so the
    tombstones are read again after `TURNS_MAX_AGE` seconds whatever the count says.
    """

    def __init__(self, history: History, clock: Callable[[], float] = time.monotonic) -> None:
        self._history = history
        self._clock = clock
        self._lock = threading.Lock()
        self._changes = 0
        self._checked: tuple[int, float] | None = None  # changes and time of the last check
        self._seen: tuple[int, int] | None = None
        self._read_at = 0.0
        self._turns = NO_SOURCES

    def changed(self) -> None:
        with self._lock:
            self._changes += 1

    def read(self, session_id: str | None, thread_id: str | None = None) -> frozenset[str]:
        """The forgotten turns a view of thread `thread_id`, run as session `session_id`,
        leaves out (`ForgottenSources.of`)."""
        return self._all().of(session_id, thread_id)

    def _all(self) -> ForgottenSources:
        with self._lock:
            now = self._clock()
            if self._checked is not None:
                changes, at = self._checked
                if changes == self._changes and now - at < CHECK_INTERVAL:
                    return self._turns
            self._checked = (self._changes, now)
            collection = self._history.existing()
            if collection is None:
                return self._turns
            mark = (self._changes, collection.count())
            if mark != self._seen or now - self._read_at >= TURNS_MAX_AGE:
                self._turns = self._history.forgotten_sources()
                self._seen, self._read_at = mark, now
            return self._turns
