"""The plug-in point every floor above shares: where a session's archived transcript lives.

The memory plug-ins (`MemoryBackend`, `Extractor`) live in `memory.protocols`; a
per-round behaviour is a `nodes.core.policy.RoundPolicy`; a feature's own plug-in
points live in its folder (`nodes.presence.hearing.ReplyJudge`,
`nodes.compaction.settings.Compactor`, `nodes.vision.settings.ImageDescriber`). Each
is runtime-checkable, so the settings that take one refuse an object that lacks its
members (isinstance checks presence, not signatures; the type checker checks those).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from langchain_core.messages import BaseMessage


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
