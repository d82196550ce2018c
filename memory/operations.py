"""Memory operations: what an extractor may ask for, and the changes the loop makes of them.

An extractor that implements `extract_operations(messages, memories)`
(`memory.protocols.ExtractsOperations`) is shown the readable memories most
similar to the conversation, numbered 1..N (`Recalled.handle`), and answers
with operations: `Add` a fact, `Supersede` handle N with a new fact, `Forget`
handle N, or nothing (an empty list). Small integer handles, as mem0 does:
a model can point only at a memory it was shown, never invent an id. A plain
`MemoryItem` in the answer is an `Add`, so an extractor that only has
`extract(messages)` keeps working.

`resolve` turns operations into `Change`s with real ids, and is where the
loop, not the model, decides: every new item is stamped with the turn's
persona and provenance (`memory.policy.stamp`); an operation on a handle
that was not shown, or on a memory the turn may not write (another persona's),
is refused and logged, and the rest of the batch goes on. A `Change` is plain
data (JSON), so a background extraction records its plan in the ledger before
applying it, and a replay after a crash applies the same plan instead of
asking the model again (`memory.cycle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict

from memory.items import MemoryItem, Scope, Source
from memory.policy import stamp
from memory.protocols import AppliesChanges, Extractor, ExtractsOperations, MemoryBackend
from memory.transcript import last_human, message_text

log = logging.getLogger("cyrene.memory")

RECALL_LIMIT = 10
"""Memories shown to an extractor at most (mem0 shows 5 a fact; a turn may hold several)."""
RECALL_POOL = 3 * RECALL_LIMIT
"""Search results re-ranked by relevance alone for the extractor."""


@dataclass(frozen=True)
class Recalled:
    """A readable memory shown to the extractor under a small integer handle (1..N)."""

    handle: int
    item: MemoryItem


@dataclass(frozen=True)
class Add:
    """Store a new fact."""

    item: MemoryItem


@dataclass(frozen=True)
class Supersede:
    """The memory shown as `handle` is no longer true: `item` replaces it (its history is kept)."""

    handle: int
    item: MemoryItem


@dataclass(frozen=True)
class Forget:
    """Erase the memory shown as `handle` (its text is gone; an audit line keeps id, scope, time)."""

    handle: int


Operation = Add | Supersede | Forget


class Change(BaseModel):
    """One operation resolved to real ids and stamped items: what a store applies.

    Attributes:
        action: `add`, `supersede` or `forget`.
        item: the new memory (add, supersede).
        target: the id of the memory superseded or forgotten.
        at: when it was decided (a replay applies the same time).
    """

    model_config = ConfigDict(frozen=True)

    action: Literal["add", "supersede", "forget"]
    item: MemoryItem | None = None
    target: str | None = None
    at: float


def handles(items: Iterable[MemoryItem]) -> list[Recalled]:
    """Number memories 1..N for an extractor."""
    return [Recalled(n, item) for n, item in enumerate(items, 1)]


def recall(
    store: MemoryBackend, messages: Sequence[BaseMessage], persona_id: str | None
) -> list[Recalled]:
    """The memories the turn's reader may see that are closest to its latest message, by
    relevance (not age)."""
    human = last_human(messages)
    query = message_text(human) if human is not None else ""
    if not query.strip():
        return []
    # Ranked by relevance alone: the fact a new one contradicts is usually the older one,
    # which the search's age decay would push below fresh, loosely related notes.
    hits = store.search(query, persona_id=persona_id, restricted=False, k=RECALL_POOL)
    closest = sorted(hits, key=lambda hit: hit.relevance, reverse=True)[:RECALL_LIMIT]
    return handles(hit.item for hit in closest)


def may_write(item: MemoryItem, persona_id: str | None) -> bool:
    """A turn writes shared memories and its own persona's, never another persona's."""
    return item.scope is not Scope.PERSONA or (
        persona_id is not None and item.persona_id == persona_id
    )


def resolve(
    operations: Iterable[Operation | MemoryItem],
    recalled: Sequence[Recalled],
    *,
    persona_id: str | None,
    source: Source,
    at: float | None = None,
) -> list[Change]:
    """The changes a turn's operations make; refused ones are logged and skipped.

    Raises:
        TypeError: an element is neither an operation nor a `MemoryItem` (the extractor is broken).
    """
    shown = {r.handle: r.item for r in recalled}
    when = time.time() if at is None else at
    changes: list[Change] = []
    targeted: set[int] = set()
    written = 0
    for operation in operations:
        operation = Add(operation) if isinstance(operation, MemoryItem) else operation
        if not isinstance(operation, Add | Supersede | Forget):
            raise TypeError(f"an extractor returned {type(operation).__name__}, not an operation")
        target: MemoryItem | None = None
        if isinstance(operation, Supersede | Forget):
            target = _target(operation.handle, shown, targeted, persona_id)
            if target is None:
                continue
            targeted.add(operation.handle)
        new: MemoryItem | None = None
        if isinstance(operation, Add | Supersede):
            new = stamp(operation.item, written, persona_id=persona_id, source=source)
            if new is None:
                continue
            written += 1
        action = {Add: "add", Supersede: "supersede", Forget: "forget"}[type(operation)]
        changes.append(
            Change.model_validate(
                {"action": action, "item": new, "target": target and target.id, "at": when}
            )
        )
    return changes


def _target(
    handle: int, shown: dict[int, MemoryItem], taken: set[int], persona_id: str | None
) -> MemoryItem | None:
    """The memory a handle names, if the turn may change it (else logged, None)."""
    item = shown.get(handle)
    if item is None:
        log.warning(
            "memory operation refused: handle %r is not one of the %d memories shown",
            handle,
            len(shown),
        )
    elif handle in taken:
        log.warning("memory operation refused: handle %d was already changed this turn", handle)
        item = None
    elif not may_write(item, persona_id):
        log.warning(
            "memory operation refused: memory %s (%s) is not writable by persona %r",
            item.id,
            item.bucket,
            persona_id,
        )
        item = None
    return item


def planned(outcome: Sequence[Any], *, persona_id: str | None, source: Source) -> list[Change]:
    """An extraction's outcome as changes: planned changes as they are, items and
    operations (an extractor called without memories) resolved."""
    if all(isinstance(change, Change) for change in outcome):
        return list(outcome)
    return resolve(outcome, [], persona_id=persona_id, source=source)


def plan_extraction(
    extractor: Extractor,
    messages: Sequence[BaseMessage],
    store: MemoryBackend,
    *,
    persona_id: str | None,
    source: Source,
) -> list[Change]:
    """Ask the extractor (showing it the memories it may change, if it takes them) and
    resolve its answer into the changes to apply, near-duplicates dropped."""
    from memory.duplicates import drop_duplicates  # numpy only when a turn extracts

    if isinstance(extractor, ExtractsOperations):
        recalled = recall(store, messages, persona_id)
        operations = list(extractor.extract_operations(messages, recalled))
    else:
        recalled, operations = [], list(extractor.extract(messages))
    changes = resolve(operations, recalled, persona_id=persona_id, source=source)
    try:
        return drop_duplicates(changes, store, persona_id, [r.item for r in recalled])
    except Exception as exc:  # the store is down: its write will wait for it, not the model
        log.warning("near-duplicate check skipped (%s: %s)", type(exc).__name__, exc)
        return changes


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
            "their new fact",
            type(store).__name__,
        )
    store.add_many([change.item for change in changes if change.item is not None])
