"""The memory plug-in points as `Protocol`s: bring your own, no base class needed.

`MemoryStore` is one `MemoryBackend`; `ManualExtractor` and `LLMExtractor` are
`Extractor`s. Both protocols are runtime-checkable, so a config can refuse an
object that lacks the members (isinstance checks presence, not signatures;
the type checker checks those).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

from memory.items import MemoryItem
from memory.ranking import SearchResult


@runtime_checkable
class MemoryBackend(Protocol):
    """Where the loop reads memories before each model call and writes extracted ones."""

    def search(
        self, query: str, persona_id: str | None = None, restricted: bool = False, k: int = 8
    ) -> Sequence[SearchResult]:
        """The `k` best memories readable by `persona_id` (only shared ones when restricted)."""
        ...

    def add_many(self, items: Iterable[MemoryItem]) -> Sequence[str]:
        """Store (upsert) the items; their ids in order. Persona items arrive stamped."""
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
