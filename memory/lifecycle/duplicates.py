"""Near-duplicates: a fact already remembered in other words is not stored again.

Two texts are near-duplicates when the store's embedding puts them at cosine
≥ `DUPLICATE_COSINE` and they state the same values (`memory.lifecycle.values`: numbers,
weekdays, months, units, negation, …), and only within one bucket: a shared fact
is stored though a persona holds it privately, and the other way. The threshold was
measured with `MultilingualEmbedding` on `tests/data/memory_recall.jsonl`
(`python -m tests.bench.memory`, "near-duplicates" rows): at 0.86, 18 of its
20 reworded pairs count as duplicates, and none of its 32 update pairs (an
old fact and the one replacing it, up to 0.85 apart: "白银段位" → "钻石段位")
nor of the 12,720 pairs of distinct facts (at most 0.71). The values rule keeps
apart what embeds alike and differs in a value: on the 85 distinct pairs of
`tests/data/memory_duplicate_pairs.jsonl` ("周一"/"周三", "5公里"/"5英里",
"喜欢"/"不喜欢", …) the cosine alone took 61 for duplicates, the numbers alone many
of them; with the values rule none, and its 17 rewordings are still caught.

The check that counts is made when a fact is written (`MemoryStore.apply`), against the
store as it is then, under its write lock: two extractions planned side by side each find
the store without the other's fact. A backend that does not check as it writes
(`memory.protocols.DropsDuplicatesOnWrite`) is checked when the extraction is planned,
against what the extractor was shown too. Either asks for the neighbours of all its new
facts at once where the backend can (`memory.protocols.FindsNeighboursAtOnce`).

A supersede is held to more: the model said the fact changed, and an update
can be as close as a rewording, so only a new fact that says the very same
words as the one it replaces is dropped (re-stating a fact must not delete it,
a bug mem0's users hit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence, Set

from memory.items import MemoryItem
from memory.lifecycle.operations import Change
from memory.lifecycle.values import values
from memory.protocols import FindsNeighbours, FindsNeighboursAtOnce

log = logging.getLogger("cyrene.memory")

DUPLICATE_COSINE = 0.86
NEIGHBOURS = 10
"""The nearest memories a new fact is compared with (and, when all are that close, those
shown to the extractor too)."""


def near_duplicate(cosine: float, a: str, b: str, threshold: float = DUPLICATE_COSINE) -> bool:
    """Whether two texts at this cosine say the same thing: they also state the same values
    (numbers, weekdays, months, units, negation: `memory.lifecycle.values`)."""
    return cosine >= threshold and values(a) == values(b)


def drop_duplicates(
    changes: Sequence[Change],
    store: object,
    persona_id: str | None,
    recalled: Sequence[MemoryItem],
    earlier: Sequence[Change] = (),
    threshold: float = DUPLICATE_COSINE,
    *,
    adds: bool = True,
    neighbours: int = NEIGHBOURS,
    restated: Callable[[MemoryItem, MemoryItem], None] | None = None,
) -> list[Change]:
    """The changes without those that would store a fact twice.

    An add is dropped when it near-duplicates a live memory the reader sees
    (the closest to the new fact, those shown to the extractor, the batch's
    earlier facts); a supersede whose new fact says what the memory it
    replaces says changes nothing and is dropped too. Memories this batch
    supersedes or forgets do not count, nor do those of the same extraction (a
    re-run rewrites them); what `earlier` (the session's earlier jobs' plans, applied
    first) writes counts as stored. A backend that cannot find neighbours
    (`memory.protocols.FindsNeighbours`) is not checked; without `adds`, only supersedes
    are (the backend checks adds as it writes them: `DropsDuplicatesOnWrite`). `restated`
    is told of each dropped fact and the memory that already says it (its turn said the
    fact again: `MemoryStore.apply` links the turn to the memory).
    """
    if not isinstance(store, FindsNeighbours):
        return list(changes)
    shown = {item.id: item for item in recalled}
    going = {change.replaced for change in [*earlier, *changes] if change.replaced}
    kept: list[Change] = []
    # What the session's earlier jobs write counts as stored (they are applied first).
    fresh: list[MemoryItem] = [c.item for c in earlier if c.item is not None]
    new_facts = [c.item for c in changes if c.action != "supersede" and c.item is not None]
    checked = new_facts if adds else []
    nearest = iter(_nearest_each(store, checked, persona_id, threshold, neighbours))
    for change in changes:
        new = change.item
        if new is None or (change.action != "supersede" and not adds):
            kept.append(change)
            continue
        if change.action == "supersede":
            old = shown.get(str(change.target))
            if old is not None and _words(old.content) == _words(new.content):
                log.info("supersede dropped: %s says what %s says", new.id, old.id)
                if restated is not None:
                    restated(new, old)
                continue
        else:
            near = next(nearest)
            crowded = len(near) == neighbours  # all that close: a duplicate may lie beyond
            twin = _twin(store, new, near, shown if crowded else {}, going, fresh, threshold)
            if twin is not None:
                log.info("memory not stored again: %s near-duplicates %s", new.id, twin.id)
                if restated is not None:
                    restated(new, twin)
                continue
        kept.append(change)
        fresh.append(new)
    return kept


def _nearest_each(
    store: FindsNeighbours,
    items: list[MemoryItem],
    persona_id: str | None,
    threshold: float,
    k: int,
) -> list[list[tuple[MemoryItem, float]]]:
    """Each new fact's `k` nearest memories at the threshold or closer: all at once from a
    backend that can (`FindsNeighboursAtOnce`), else one `nearest` search each."""
    if not items:
        return []
    if isinstance(store, FindsNeighboursAtOnce):
        return [list(hits) for hits in store.neighbours(items, k, threshold)]
    return [list(store.nearest(i.content, persona_id, k, threshold)) for i in items]


def _twin(
    store: FindsNeighbours,
    new: MemoryItem,
    nearest: list[tuple[MemoryItem, float]],
    shown: Mapping[str | None, MemoryItem],
    going: Set[str],
    fresh: list[MemoryItem],
    threshold: float,
) -> MemoryItem | None:
    """The live memory `new` near-duplicates, if any.

    The store's cosines of its `nearest` memories at the threshold or closer come
    with the search; the memories `shown` (those shown to the extractor, when all the
    nearest are that close: otherwise they are farther, so no duplicate) outside them
    are embedded, and the batch's earlier facts always are.
    """
    found = {item.id for item, _ in nearest}
    others = [item for item in shown.values() if item.id not in found]
    others += [item for item in fresh if item.bucket == new.bucket]
    pairs = nearest + list(
        zip(others, store.similarities(new.content, [i.content for i in others]), strict=True)
    )
    return next(
        (
            item
            for item, cosine in pairs
            if item.id not in going
            and item.bucket == new.bucket  # a fact another scope holds is not this one's
            and not _same_writer(item, new)
            and near_duplicate(cosine, new.content, item.content, threshold)
        ),
        None,
    )


def _words(text: str) -> str:
    """A text's words, without case, spacing or punctuation."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _same_writer(stored: MemoryItem, new: MemoryItem) -> bool:
    """The same memory, or one the same extraction wrote (a re-run rewrites it)."""
    return stored.id == new.id or (
        new.source.extraction is not None and stored.source.extraction == new.source.extraction
    )
