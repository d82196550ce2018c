"""Memory operations: what an extractor may ask for, and the changes the loop makes of them.

An extractor that implements `extract_operations(messages, memories)`
(`memory.protocols.ExtractsOperations`) is shown (`nodes.extraction.planning.recall`)
the readable memories most similar to the conversation, numbered 1..N (`Recalled.handle`), and answers
with operations: `Add` a fact, `Supersede` handle N with a new fact, `Forget`
handle N, `Restated` handle N (the turn says it again: nothing is written, the turn is
linked to it), or nothing (an empty list). Small integer handles, as mem0 does:
a model can point only at a memory it was shown, never invent an id. A plain
`MemoryItem` in the answer is an `Add`, so an extractor that only has
`extract(messages)` keeps working.

`resolve` turns operations into `Change`s with real ids, and is where the
loop, not the model, decides: every new item is stamped with the turn's
persona and provenance (`memory.lifecycle.policy.stamp`); an operation on a handle
that was not shown, or on a memory the turn may not write (another persona's),
is refused and logged, and the rest of the batch goes on. A `Change` is plain
data (JSON), so a background extraction records its plan in the ledger before
applying it, and a replay after a crash applies the same plan instead of
asking the model again (`nodes.extraction.cycle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from memory.items import MemoryItem, Scope, Source
from memory.lifecycle.policy import stamp

log = logging.getLogger("cyrene.memory")


@dataclass(frozen=True)
class Recalled:
    """A readable memory shown to the extractor under a small integer handle (1..N), with
    how relevant the store found it to the owner's latest message (None: not known)."""

    handle: int
    item: MemoryItem
    relevance: float | None = None


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


@dataclass(frozen=True)
class Restated:
    """The turn says again what the memory shown as `handle` says: nothing is written, and
    the turn is linked to that memory, so a forget of it takes this turn out of view too."""

    handle: int


Operation = Add | Supersede | Forget | Restated


class Change(BaseModel):
    """One operation resolved to real ids and stamped items: what a store applies.

    Attributes:
        action: `add`, `supersede`, `forget` or `restate` (the turn said a memory again).
        item: the new memory (add, supersede).
        target: the id of the memory superseded, forgotten or said again.
        at: when it was decided (a replay applies the same time).
        said_in: the turn that said the memory again (restate: its ids, no text).
    """

    model_config = ConfigDict(frozen=True)

    action: Literal["add", "supersede", "forget", "restate"]
    item: MemoryItem | None = None
    target: str | None = None
    at: float
    said_in: Source | None = None

    @property
    def replaced(self) -> str | None:
        """The memory this change takes out of the store: a supersede's or a forget's target."""
        return self.target if self.action in ("supersede", "forget") else None


def handles(
    items: Iterable[MemoryItem], relevances: Iterable[float | None] | None = None
) -> list[Recalled]:
    """Number memories 1..N for an extractor (with the store's relevance of each)."""
    scores = list(relevances) if relevances is not None else []
    return [
        Recalled(n, item, scores[n - 1] if n <= len(scores) else None)
        for n, item in enumerate(items, 1)
    ]


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
    shown = {r.handle: r for r in recalled}
    when = time.time() if at is None else at
    changes: list[Change] = []
    targeted: set[int] = set()
    written = 0
    for operation in operations:
        operation = Add(operation) if isinstance(operation, MemoryItem) else operation
        if not isinstance(operation, Add | Supersede | Forget | Restated):
            raise TypeError(f"an extractor returned {type(operation).__name__}, not an operation")
        target: MemoryItem | None = None
        if isinstance(operation, Supersede | Forget | Restated):
            target = _target(operation.handle, shown, targeted, persona_id)
            if target is None:
                continue
            if not isinstance(operation, Restated):  # saying it again does not change it
                targeted.add(operation.handle)
        new: MemoryItem | None = None
        if isinstance(operation, Add | Supersede):
            new = stamp(operation.item, written, persona_id=persona_id, source=source)
            if new is None:
                continue
            written += 1
        action = {Add: "add", Supersede: "supersede", Forget: "forget", Restated: "restate"}
        change = {"action": action[type(operation)], "item": new, "at": when}
        said_in = source if isinstance(operation, Restated) else None
        changes.append(
            Change.model_validate({**change, "target": target and target.id, "said_in": said_in})
        )
    return changes


MIN_TARGET_RELEVANCE = 0.2
"""The store's relevance (to the owner's latest message) below which no extractor may
supersede or forget a memory: the message names nothing like it. A safety net under a
model's own judgement (`LLMExtractor`'s prompt states the rule; `ManualExtractor` has
stricter ones): on `tests/data/memory_phrases.jsonl` the closest memory of a forget that
names nothing ("忘掉吧", "forget that, never mind", "忘掉刚才说的话") scores 0.05-0.20; the
facts corrected in `memory_recall.jsonl`'s update pairs, 0.28 and up (a knee injury
replacing running)."""


def _target(
    handle: int, shown: dict[int, Recalled], taken: set[int], persona_id: str | None
) -> MemoryItem | None:
    """The memory a handle names, if the turn may change it (else logged, None)."""
    recalled = shown.get(handle)
    item = recalled.item if recalled is not None else None
    relevance = recalled.relevance if recalled is not None else None
    if recalled is not None and relevance is not None and relevance < MIN_TARGET_RELEVANCE:
        log.warning(
            "memory operation refused: memory %s (relevance %.2f) is not what the message names",
            recalled.item.id,
            relevance,
        )
        return None
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
