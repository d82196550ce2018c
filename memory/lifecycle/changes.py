"""`MemoryStore`'s lifecycle half: supersede, forget, history, and applying planned changes.

Every method here is idempotent, because a background extraction cut off by a
crash applies its recorded plan again (`nodes.extraction.cycle`): a memory already
superseded is not superseded twice (its replacement is written again, which
is an upsert), a memory already forgotten stays forgotten, and a change
decided before a memory was forgotten never brings it back. A change decided
later may (the owner said "remember" again).

`apply` checks for near-duplicates at write time, under the store's `WriteLock`: two
extractions of the same fact planned side by side (two sessions, two workers) each
checked a store that held neither, so only a check made with the write, one writer at a
time, sees the other's fact (`memory.lifecycle.duplicates`).
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memory.items import MemoryItem, Source
from memory.lifecycle.duplicates import NEIGHBOURS, drop_duplicates
from memory.lifecycle.history import ForgottenTurns, History, HistoryEntry, Turn
from memory.retrieval.aliases import drop_aliases, leave_alias
from memory.retrieval.lexical import LexicalIndex
from memory.storage.buckets import Buckets
from memory.storage.erasure import Gate, exclusively, gated
from memory.storage.lock import WriteLock
from memory.storage.records import closest, records
from memory.storage.sealing import Documents
from nodes.kernel.text import clean_text

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection

    from memory.lifecycle.operations import Change

log = logging.getLogger("cyrene.memory")


class Lifecycle:
    """Mixed into `MemoryStore`, which provides the members declared below."""

    _history: History
    _forgotten_turns: ForgottenTurns
    _gate: Gate
    _documents: Documents
    _lexical: LexicalIndex
    _writes: WriteLock
    _buckets: Buckets
    clock: Callable[[], float]
    drops_duplicates_on_write = True
    """`apply` drops an add that near-duplicates a live memory (`memory.protocols.DropsDuplicatesOnWrite`)."""
    embedding_function: Any

    if TYPE_CHECKING:

        def _collection(self, bucket: str, *, create: bool) -> Collection | None: ...

        def _find(self, item_id: str) -> tuple[Collection, Mapping[str, Any]] | None: ...
        def _stored(self) -> builtins.list[Collection]: ...
        def _stored_ids(self, ids: builtins.list[str]) -> set[str]: ...
        def add_many(self, items: Iterable[MemoryItem]) -> builtins.list[str]: ...
        def _write(self, items: Iterable[MemoryItem]) -> builtins.list[str]: ...
        def get(self, item_id: str) -> MemoryItem | None: ...
        def _erase(self, ids: builtins.list[str]) -> None: ...

    @gated
    def supersede(self, item_id: str, new: MemoryItem, *, at: float | None = None) -> bool:
        """Replace a memory with a new one; the old is kept in its history, never searched again.

        Args:
            item_id: the memory that is no longer true.
            new: what is true now (a persona item must name its persona).
            at: when it was decided (default: now).

        Returns:
            True when `item_id` was live and is now superseded; False when it was not
            (already superseded, forgotten, or unknown): `new` is stored all the same,
            unless it was forgotten after `at`.

        Raises:
            ValueError: a persona-scope `new` without `persona_id`.
        """
        when = self.clock() if at is None else at
        # One hold of the gate (`gated`): no forget falls between these steps.
        found = self._find(item_id)
        old = records(found[1], self._documents)[0] if found is not None else None
        # A replacement forgotten since took what it replaced with it: no history, no alias.
        current = not _forgotten_since(self._history.entries([str(new.id)]), new, when)
        if str(new.id) == item_id:  # the same record rewritten (a re-run's own item)
            if current:
                self._write([new])
            return old is not None
        if current:
            if old is not None:
                self._history.superseded(old, by=str(new.id), at=when)
            self._write([new])
        if found is None or old is None:
            return False
        gone = [item_id]
        if current:
            alias, dropped = leave_alias(found[0], old, new, self._documents)
            if alias is not None:
                self._lexical.put(old.bucket, [alias], [old.content])
            gone += dropped
        found[0].delete(ids=[item_id])
        self._lexical.remove(gone)
        return True

    @exclusively
    def forget(self, item_id: str, *, at: float | None = None) -> bool:
        """Forget a memory and every memory it replaced: their text leaves the store.

        Search and export no longer see them, and in an embedded store the text
        is erased from the files too (`memory.storage.erasure`). An audit line (log
        `cyrene.memory`, and a tombstone in its history) keeps id, scope and time, and
        the tombstones the session and id of every message that said them: the one each
        came from and those that said it again (`forgotten_turns`).

        Args:
            item_id: the memory's id (a superseded one's too).
            at: when it was decided (default: now).

        Returns:
            True when there was something to forget.
        """
        when = self.clock() if at is None else at
        found = self._find(item_id)
        kept = self._history.entry(item_id)
        ancestry = self._history.ancestry(item_id)
        # A replaced fact stated again since is live again: it is not this memory's to take.
        restated = self._stored_ids([e.item_id for e in ancestry])
        subject = (
            records(found[1], self._documents)[0]
            if found is not None
            else kept.item
            if kept
            else None
        )
        if subject is None:  # unknown, or already forgotten
            return False
        older = [e.item for e in ancestry if e.item is not None and e.item_id not in restated]
        owners = {str(i.id): (i.scope.value, i.persona_id) for i in [subject, *older]}
        ids = builtins.list(owners)
        if found is not None:
            found[0].delete(ids=[item_id])
        # The words they left as aliases go too, and any alias that pointed to them.
        words = list(dict.fromkeys(w for c in self._stored() for w in drop_aliases(c, ids)))
        sources = {str(i.id): Turn.said(i.source) for i in [subject, *older]}
        self._history.forgotten(ids, owners, when, sources)
        self._forgotten_turns.changed()
        self._erase([*ids, *words])
        for forgotten in ids:
            log.info(
                "memory forgotten: id=%s scope=%s at=%.3f", forgotten, owners[forgotten][0], when
            )
        return True

    def _link_turns(
        self, links: dict[str, set[Turn]], changes: Sequence[Change], adds: Sequence[MemoryItem]
    ) -> None:
        """Link to their memories `links` (the turns of the near-duplicates dropped), the
        turns `changes` say restated a memory, and those `adds` rewrite away: the same id
        written again (the same words, said inline) keeps the new turn as its source."""
        for change in changes:
            if change.action == "restate" and change.target and change.said_in:
                _link(links, change.target, change.said_in)
        # A background extraction's ids come from the extraction: the same id is its own
        # re-run, the same turn. Only an id from the words can be another turn's.
        by_words = [item for item in adds if not item.source.extraction]
        for item, stored in self._stored_sources(by_words):
            _link(links, str(item.id), stored, item.source)
        if links:
            self._history.restated(links)
            self._forgotten_turns.changed()

    def _stored_sources(
        self, items: Sequence[MemoryItem]
    ) -> builtins.list[tuple[MemoryItem, Source]]:
        """The items whose id is a live memory of their bucket, each with the source it is
        stored with."""
        by_bucket: dict[str, builtins.list[MemoryItem]] = {}
        for item in items:
            by_bucket.setdefault(item.bucket, []).append(item)
        pairs: builtins.list[tuple[MemoryItem, Source]] = []
        for bucket, group in by_bucket.items():
            collection = self._collection(bucket, create=False)
            if collection is None:
                continue
            got = collection.get(ids=[str(i.id) for i in group], include=["metadatas"])
            stored = dict(zip(got["ids"], got["metadatas"] or [], strict=True))
            pairs += [
                (item, MemoryItem.from_record(str(item.id), item.content, dict(meta)).source)
                for item in group
                if (meta := stored.get(str(item.id))) is not None
            ]
        return pairs

    @gated
    def forgotten_turns(
        self, session_id: str | None, thread_id: str | None = None
    ) -> frozenset[str]:
        """The ids of the messages that opened turns of thread `thread_id` (run as session
        `session_id`) whose memories were forgotten (`memory.protocols.KnowsForgottenTurns`):
        that thread's view leaves those turns out. By thread, since a caller may give two
        threads' messages the same id, and whatever session or turn ids the app stamped; a
        memory that names no thread (stamped before threads were kept, or added by hand with
        a `Source`) by its session and message id. Cached: read again when a forget here, or
        the history's record count once a second, says so."""
        return self._forgotten_turns.read(session_id, thread_id)

    @gated
    def history(self, item_id: str) -> builtins.list[HistoryEntry]:
        """A memory's chain, oldest first: what it replaced, itself, and what replaced it.

        Args:
            item_id: any memory of the chain.

        Returns:
            The entries (live, superseded, forgotten); [] for an unknown id.
        """
        chain: builtins.list[HistoryEntry] = []
        current: str | None = item_id
        while current is not None and current not in {e.item_id for e in chain}:
            live = self.get(current)
            if live is not None:
                chain.append(HistoryEntry(current, "live", live, scope=live.scope.value))
                break
            entry = self._history.entry(current)
            if entry is None:
                break
            chain.append(entry)
            current = entry.superseded_by
        if not chain:
            return []
        return builtins.list(reversed(self._history.ancestry(item_id))) + chain

    @gated
    def neighbours(
        self, items: Sequence[MemoryItem], k: int = 8, min_cosine: float = -1.0
    ) -> builtins.list[builtins.list[tuple[MemoryItem, float]]]:
        """Each item's `k` closest live memories in its own bucket at `min_cosine` or closer,
        with their embedding cosine, closest first (`memory.protocols.FindsNeighboursAtOnce`):
        one embedding call for every item and one query per bucket, whatever their number.

        Args:
            items: the new memories (a persona item must name its persona).
            k: how many neighbours each at most.
            min_cosine: the farthest a neighbour may be.

        Returns:
            One list per item, in order.
        """
        vectors = self.embedding_function.embed_query([clean_text(i.content) for i in items])
        found: builtins.list[builtins.list[tuple[MemoryItem, float]]] = [[] for _ in items]
        by_bucket: dict[str, builtins.list[int]] = {}
        for n, item in enumerate(items):
            by_bucket.setdefault(item.bucket, []).append(n)
        for bucket, where in by_bucket.items():
            self._buckets.missing.pop(bucket, None)  # another writer may have just made it
            collection = self._collection(bucket, create=False)
            if collection is None:
                continue
            near = closest(collection, [vectors[n] for n in where], self._documents, k, min_cosine)
            for n, hits in zip(where, near, strict=True):
                found[n] = hits
        return found

    def apply(self, changes: Sequence[Change]) -> None:
        """Apply planned changes (`memory.lifecycle.operations`), idempotently: adds, then
        supersedes and forgets in order (`memory.protocols.AppliesChanges`). An add that
        near-duplicates a live memory of its bucket, or an earlier fact of `changes`, is
        dropped: checked and written under the store's write lock, so no other writer's
        fact slips in between. The turn that said it again is linked to the memory that says
        it, by ids (`History.restated`), and so is the turn an add of the same id rewrites
        away, so a forget leaves every turn that said the fact out of the view."""
        with self._writes.held():
            with self._gate.shared():  # not held across the forgets below: they hold it alone
                adding = [c.item for c in changes if c.action == "add" and c.item is not None]
                known = self._history.entries([str(i.id) for i in adding]) if adding else {}
                live = [
                    c
                    for c in changes
                    if c.action != "add"
                    or (c.item is not None and not _forgotten_since(known, c.item, c.at))
                ]
                said_again: dict[str, set[Turn]] = {}
                # Nothing shown to compare with here: a crowd of close memories is read deeper.
                live = drop_duplicates(
                    live,
                    self,
                    None,
                    [],
                    neighbours=4 * NEIGHBOURS,
                    restated=lambda new, old: _link(
                        said_again, str(old.id), new.source, old.source
                    ),
                )
                adds = [c.item for c in live if c.action == "add" and c.item is not None]
                self._link_turns(said_again, live, adds)
            if adds:
                self.add_many(adds)
            for change in live:
                if change.action == "supersede" and change.target and change.item:
                    self.supersede(change.target, change.item, at=change.at)
                elif change.action == "forget" and change.target:
                    self.forget(change.target, at=change.at)


def _link(
    links: dict[str, set[Turn]], memory: str, said_in: Source, own: Source | None = None
) -> None:
    """Add to `links` the turn `said_in` names as one that said memory `memory`, unless it
    names no message or is `own` (the memory's own source)."""
    turn = Turn.said(said_in)
    if turn is not None and (own is None or turn != Turn.said(own)):
        links.setdefault(memory, set()).add(turn)


def _forgotten_since(entries: Mapping[str, HistoryEntry], item: MemoryItem, at: float) -> bool:
    """Whether the memory was forgotten at or after `at` (a change that old must not bring
    it back), by its history entry among `entries`."""
    entry = entries.get(str(item.id))
    return entry is not None and entry.state == "forgotten" and (entry.at or 0.0) >= at
