"""The memory plug-in points as `Protocol`s: bring your own, no base class needed.

`MemoryStore` is one `MemoryBackend`; the loop's `ManualExtractor` and
`LLMExtractor` are `Extractor`s that also `ExtractsOperations`. The protocols are runtime-checkable, so a config can refuse an
object that lacks the members (isinstance checks presence, not signatures;
the type checker checks those).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

from memory.items import MemoryItem
from memory.retrieval.ranking import SearchResult

if TYPE_CHECKING:
    from memory.lifecycle.operations import Change, Operation, Recalled


@runtime_checkable
class MemoryBackend(Protocol):
    """Where the loop reads memories before each model call and writes extracted ones.

    A backend may also provide its extraction ledger
    (`nodes.extraction.ledger.ProvidesExtractionLedger`): one on a server, shared
    by every worker, keeps background extraction exactly once across processes.
    """

    def search(
        self, query: str, persona_id: str | None = None, restricted: bool = False, k: int = 8
    ) -> Sequence[SearchResult]:
        """The `k` best memories readable by `persona_id` (only shared ones when restricted)."""
        ...

    def add_many(self, items: Iterable[MemoryItem]) -> Sequence[str]:
        """Store (upsert) the items; their ids in order. Persona items arrive stamped."""
        ...


@runtime_checkable
class FindsNeighbours(Protocol):
    """The optional part of a `MemoryBackend` that lets the loop drop near-duplicates.

    Before a new fact is stored, the loop compares it with its nearest
    readable memories (`memory.lifecycle.duplicates`). A backend without this method
    stores every fact it is given.
    """

    def nearest(
        self, text: str, persona_id: str | None = None, k: int = 8, min_cosine: float = -1.0
    ) -> Sequence[tuple[MemoryItem, float]]:
        """The `k` memories `persona_id` may read (unrestricted) closest to `text`, with
        their embedding cosine (in [-1, 1]), closest first: no fusion, no decay; only
        those at `min_cosine` or closer."""
        ...

    def similarities(self, text: str, others: Sequence[str]) -> Sequence[float]:
        """The embedding cosine of `text` with each of `others`."""
        ...


@runtime_checkable
class FindsNeighboursAtOnce(Protocol):
    """The optional part of a `FindsNeighbours` backend that finds the neighbours of many new
    facts in one go: an extraction's facts are checked with one query per bucket, not
    one search each."""

    def neighbours(
        self, items: Sequence[MemoryItem], k: int = 8, min_cosine: float = -1.0
    ) -> Sequence[Sequence[tuple[MemoryItem, float]]]:
        """Each item's `k` closest live memories in its own bucket, at `min_cosine` or closer,
        with their embedding cosine, closest first; one sequence per item."""
        ...


@runtime_checkable
class RanksByRelevance(Protocol):
    """The optional part of a `MemoryBackend` that ranks by relevance alone.

    An extractor is shown the memories most relevant to the latest message
    (`nodes.extraction.planning.recall`), whatever their age: the fact a new one replaces
    is usually old, and a ranking that discounts age puts fresh, loosely related
    notes above it. A backend without this method is asked `search` for three
    times as many and they are re-ranked by relevance.
    """

    def relevant(
        self, query: str, persona_id: str | None = None, k: int = 8
    ) -> Sequence[SearchResult]:
        """The `k` memories `persona_id` may read (unrestricted) most relevant to `query`."""
        ...


@runtime_checkable
class DropsDuplicatesOnWrite(Protocol):
    """The optional part of an `AppliesChanges` backend whose `apply` itself drops an add that
    near-duplicates a live memory, checked and written as one step under its write lock
    (`MemoryStore`): the loop does not check the adds of a plan against such a backend
    beforehand, as the check that counts is the one made with the write."""

    drops_duplicates_on_write: bool


@runtime_checkable
class PrunesExtractions(Protocol):
    """The optional part of a `MemoryBackend` that lets a re-run extraction leave nothing behind.

    A background extraction's items have ids from the extraction and their
    position (`memory.items.extraction_item_id`) and carry its key in
    `source.extraction`. When a crash cut a run off after it stored its items
    and before they were marked done, the extraction runs again and rewrites
    those ids; this deletes what the earlier run stored beyond the new run's
    items (it may return fewer). A backend without it keeps such extras (logged
    once per backend type).
    """

    def prune_extractions(self, written: Mapping[str, Set[str]]) -> int:
        """Delete the items of these extractions (key → the ids just written) that were not
        just written; how many went."""
        ...


@runtime_checkable
class KnowsForgottenTurns(Protocol):
    """The optional part of a `MemoryBackend` that names the turns forgotten memories came from.

    The model's view leaves out every message of such a turn, live or recalled
    (`nodes.context.forgotten`); the transcript keeps them. A backend without it
    leaves the view as it is.
    """

    def forgotten_turns(
        self, session_id: str | None, thread_id: str | None = None
    ) -> frozenset[str]:
        """The ids of the human messages that opened turns of thread `thread_id`, run as
        session `session_id`, whose memories were forgotten: asked every round, so it must
        be cheap (cached)."""
        ...


@runtime_checkable
class Extractor(Protocol):
    """Turns a finished conversation into candidate memories.

    It deliberately does not know the persona: a persona-scope item may leave
    `persona_id` unset, and the loop stamps the turn's persona and provenance
    over whatever it returns. `background = True` runs it off the reply path.
    """

    background: bool

    def extract(self, messages: Sequence[BaseMessage]) -> Iterable[MemoryItem]:
        """Candidate memories from the conversation (the turn's messages, oldest first)."""
        ...


@runtime_checkable
class ExtractsOperations(Protocol):
    """The optional part of an `Extractor` that may change what is already remembered.

    The loop shows it the readable memories most similar to the conversation
    (the turn's reader's scopes only, at most `nodes.extraction.planning.RECALL_LIMIT`),
    numbered 1..N; it answers with operations on those handles
    (`memory.lifecycle.operations`): add, supersede N, forget N, or none. An extractor
    without this method is asked `extract(messages)` and its items are added.
    """

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> Iterable[Operation | MemoryItem]:
        """Operations for this conversation; a plain `MemoryItem` means add it."""
        ...


@runtime_checkable
class AppliesChanges(Protocol):
    """The optional part of a `MemoryBackend` that supersedes and forgets, not only adds.

    `apply` must be idempotent: a background extraction cut off by a crash
    applies its recorded plan again, which must not supersede twice nor bring
    back a forgotten memory. A backend without it gets the changes' new facts
    through `add_many` (logged once per backend type).
    """

    def apply(self, changes: Sequence[Change]) -> None:
        """Apply resolved changes (`memory.lifecycle.operations.Change`), in order."""
        ...
