"""What the loop does with an extractor's answer: plan the changes, then apply them.

`plan_extraction` shows the extractor the memories it may change (if it takes
them), resolves its operations into stamped `Change`s (`memory.lifecycle.operations`) and
drops near-duplicates (`memory.lifecycle.duplicates`); `apply_changes` hands them to the
backend. A module of its own so that operations and duplicates need not import
each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from memory.items import MemoryItem, Source
from memory.lifecycle.duplicates import drop_duplicates
from memory.lifecycle.operations import Change, Recalled, handles, resolve
from memory.protocols import (
    AppliesChanges,
    DropsDuplicatesOnWrite,
    Extractor,
    ExtractsOperations,
    FindsNeighbours,
    MemoryBackend,
    RanksByRelevance,
)
from nodes.kernel.messages import last_human, message_text

log = logging.getLogger("cyrene.memory")

RECALL_LIMIT = 10
"""Memories shown to an extractor at most (mem0 shows 5 a fact; a turn may hold several)."""
RECALL_POOL = 3 * RECALL_LIMIT
"""Search results re-ranked by relevance alone for the extractor (of a backend that cannot
rank by relevance itself: `memory.protocols.RanksByRelevance`)."""


def recall(
    store: MemoryBackend,
    messages: Sequence[BaseMessage],
    persona_id: str | None,
    earlier: Sequence[Change] = (),
) -> list[Recalled]:
    """The memories the turn's reader may see that are closest to its latest message, by
    relevance (not age), as they stand once `earlier` (what the session's earlier jobs
    plan to change, not yet applied) is: what they replace or forget is gone, what they
    write is there."""
    human = last_human(messages)
    query = message_text(human) if human is not None else ""
    if not query.strip():
        return []
    # Ranked by relevance alone: the fact a new one contradicts is usually the older one,
    # which the search's age decay would push below fresh, loosely related notes.
    if isinstance(store, RanksByRelevance):
        hits = list(store.relevant(query, persona_id, k=RECALL_LIMIT))
    else:
        hits = list(store.search(query, persona_id=persona_id, restricted=False, k=RECALL_POOL))
    gone = {change.replaced for change in earlier if change.replaced}
    scored = [(hit.item, hit.relevance) for hit in hits if hit.item.id not in gone]
    written = [c.item for c in earlier if c.item is not None and c.item.id not in gone]
    if written and isinstance(store, FindsNeighbours):
        scored += zip(written, store.similarities(query, [i.content for i in written]), strict=True)
    closest = sorted(scored, key=lambda pair: pair[1], reverse=True)[:RECALL_LIMIT]
    return handles((item for item, _ in closest), (score for _, score in closest))


def plan_extraction(
    extractor: Extractor,
    messages: Sequence[BaseMessage],
    store: MemoryBackend,
    *,
    persona_id: str | None,
    source: Source,
    earlier: Sequence[Change] = (),
) -> list[Change]:
    """Ask the extractor (showing it the memories it may change, if it takes them) and
    resolve its answer into the changes to apply, near-duplicates dropped; against the
    store as it stands once `earlier` (the session's earlier jobs' plans) is applied."""
    if isinstance(extractor, ExtractsOperations):
        recalled = recall(store, messages, persona_id, earlier)
        operations = list(extractor.extract_operations(messages, recalled))
    else:
        recalled, operations = [], list(extractor.extract(messages))
    changes = resolve(operations, recalled, persona_id=persona_id, source=source)
    # A store that checks its adds as it writes them is not asked twice.
    adds = not (isinstance(store, DropsDuplicatesOnWrite) and store.drops_duplicates_on_write)
    shown = [r.item for r in recalled]
    # A fact dropped for saying what a memory says was said again in this turn.
    said_again: list[Change] = []

    def restated(new: MemoryItem, memory: MemoryItem) -> None:
        restate = {"target": memory.id, "said_in": new.source, "at": time.time()}
        said_again.append(Change.model_validate({"action": "restate", **restate}))

    try:
        kept = drop_duplicates(
            changes, store, persona_id, shown, earlier, adds=adds, restated=restated
        )
    except Exception as exc:  # the store is down: its write will wait for it, not the model
        log.warning("near-duplicate check skipped (%s: %s)", type(exc).__name__, exc)
        return changes
    return kept + said_again


_UNAPPLIED: set[type] = set()


def apply_changes(store: MemoryBackend, changes: Sequence[Change]) -> None:
    """Apply changes to a backend: all of them if it can (`AppliesChanges`), else its adds
    and each new fact of a supersede (logged once per backend type)."""
    if isinstance(store, AppliesChanges):
        store.apply(changes)
        return
    if any(change.action != "add" for change in changes) and type(store) not in _UNAPPLIED:
        _UNAPPLIED.add(type(store))
        log.warning(
            "memory backend %s has no apply(): supersede and forget operations only add "
            "their new fact, and a fact said again links no turn",
            type(store).__name__,
        )
    store.add_many([change.item for change in changes if change.item is not None])
