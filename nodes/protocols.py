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
