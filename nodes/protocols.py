"""The loop's plug-in points as `Protocol`s: bring your own, no base class needed.

Each is runtime-checkable, so `LoopConfig` refuses an object that lacks the
members (isinstance checks presence, not signatures; the type checker checks
those). The memory plug-ins (`MemoryBackend`, `Extractor`) live in
`memory.protocols`; a per-round behaviour is a `nodes.policies.RoundPolicy`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

Describe = Callable[[BaseMessage], str]
"""How a compactor names a message's speaker (`nodes.view.attribution.describe_speaker`)."""


@runtime_checkable
class ImageDescriber(Protocol):
    """Turns one image content block into text (a vision model's answer, OCR, a caption)."""

    def __call__(self, block: dict[str, Any], /) -> str: ...


@runtime_checkable
class Compactor(Protocol):
    """Folds older messages into a running summary (`StructuralCompactor`, `LLMCompactor`, yours)."""

    def compact(
        self, messages: Sequence[BaseMessage], previous: str | None, budget: int, describe: Describe
    ) -> str:
        """Summarise `messages` (new since `previous`) into at most ~`budget` tokens."""
        ...


@runtime_checkable
class TranscriptArchive(Protocol):
    """Where a session's older messages go once compaction's summary covers them.

    Positions count from the session's first message; writing a position again
    writes the same message (a step re-run after a crash), so `append` is
    idempotent. `graph.storage.archive` keeps one beside each checkpointer.
    """

    def append(self, thread: tuple[str, str], start: int, messages: Sequence[BaseMessage]) -> None:
        """Store `messages` at positions `start`, `start + 1`, … of `thread` (id, namespace)."""
        ...

    def read(self, thread: tuple[str, str], start: int, stop: int) -> list[BaseMessage]:
        """The archived messages at positions [start, stop), in order."""
        ...
