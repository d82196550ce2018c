"""The loop's plug-in points as `Protocol`s: bring your own, no base class needed.

Each is runtime-checkable, so `LoopConfig` refuses an object that lacks the
members (isinstance checks presence, not signatures; the type checker checks
those). The memory plug-ins (`MemoryBackend`, `Extractor`) live in
`memory.protocols`; a per-round behaviour is a `nodes.core.policy.RoundPolicy`. A
`ReplyJudge` decides whether the companion speaks in a group chat; `Hearing` and
`ReplyVerdict` are what it reads and returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

Describe = Callable[[BaseMessage], str]
"""How a compactor names a message's speaker (`nodes.context.attribution.describe_speaker`)."""


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


@dataclass(frozen=True)
class Hearing:
    """What a group chat said since the companion last spoke, as a `ReplyJudge` reads it.

    Built by the loop from the transcript's tail before the model is called.
    Whether the turn mentions the companion is worked out here (`addressed`),
    from the text and the platform's flag only: a display name never counts.
    """

    persona_id: str | None
    """The persona answering in the group (the default one)."""
    names: tuple[str, ...]
    """The persona's name and nicknames, as a mention would spell them."""
    recent: tuple[BaseMessage, ...]
    """The last messages of the conversation (people's and the companion's), oldest first."""
    pending: tuple[BaseMessage, ...]
    """The people's messages since the companion last spoke, oldest first (this turn's last)."""
    speakers: tuple[str, ...]
    """Who spoke in `recent`, first appearance first: display names, `主人` for the owner."""
    addressed: str | None
    """Why the turn addresses the companion ("mentioned 昔涟", "the platform flagged a
    mention"), or None."""
    own_share: float
    """The companion's share of `recent` (0 when it has not spoken there)."""


@dataclass(frozen=True)
class ReplyVerdict:
    """A judge's answer: speak now, or stay quiet; the reason shows in Studio and the stream."""

    reply: bool
    reason: str


@runtime_checkable
class ReplyJudge(Protocol):
    """Decides whether the companion answers a group turn (`LoopConfig(group_reply="judged")`).

    `ReplyScorer` (offline, the default) and `LLMReplyJudge` (a model with structured
    output) are the loop's own. A judge that blocks (I/O, a model) should say so with
    `blocking = True` (assumed when absent): an async turn then asks it off the event
    loop. A judge that raises is logged and the turn answers.
    """

    def judge(self, hearing: Hearing, /) -> ReplyVerdict:
        """Reply or wait, with a reason."""
        ...
