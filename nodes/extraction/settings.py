"""`Extraction`: how long a background extraction may take, and what a session keeps of
its extractions.

Which extractor runs is `LoopConfig.extractor` (with `LoopConfig.memory`, the
store it writes to); how it runs, exactly once and durably, is this folder.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pydantic import Field

from nodes.core.feature import Feature
from nodes.core.state import LoopState
from nodes.extraction.jobs import DEFAULT_TIMEOUT

PENDING = "pending_extractions"
EXTRACTED_TURN = "extracted_turn"


class PendingExtraction(TypedDict):
    """A turn's background extraction, recorded in the checkpoint before the turn returns.

    Enough to run it again after a crash: the transcript is in the same
    checkpoint, so the snapshot is every visible message up to `boundary`.
    """

    key: str
    """Identity of the extraction (thread + the turn's opening messages, `extraction_key`;
    thread + boundary in entries saved before); the ledger's record id."""
    boundary: str
    """Id of the turn's last message: the snapshot ends there."""
    session_id: str | None
    """Provenance stamped on the memories: the run's session."""
    message_id: str | None
    """Provenance stamped on the memories: the turn's inbound message."""
    persona_id: str | None
    """The persona that produced the turn (persona-scope memories go there)."""
    thread: NotRequired[str | None]
    """The session (thread) it belongs to: a session's extractions run in turn order."""
    order: NotRequired[int]
    """The turn's number in its session (entries saved before orders were kept: 0)."""


class ExtractionState(LoopState):
    """The keys extraction keeps in a session."""

    pending_extractions: NotRequired[list[PendingExtraction]]
    """Background extractions not yet seen done or lost (see `nodes.extraction.node`)."""
    extracted_turn: NotRequired[str]
    """Id of the message that opened the latest turn `extract_memory` ran for (a turn opened
    after it and before the current one died before that node; see `nodes.extraction.node`)."""


class Extraction(Feature):
    """Memory extraction after each owner turn (never in group or stranger chats).

    Example:
        >>> LoopConfig(model=model, memory=store, extractor=LLMExtractor(model), features=[Extraction(timeout=30)])
    """

    state_schema = ExtractionState

    timeout: float = Field(
        default=DEFAULT_TIMEOUT,
        gt=0,
        description="seconds a background extraction may take; late results are discarded",
    )
