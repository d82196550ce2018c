"""The key token accounting keeps in a session: tokens per call, per turn and per session."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from langchain_core.messages.ai import UsageMetadata

from nodes.core.state import LoopState


class TokenUsage(TypedDict):
    """Tokens the session's model calls used, as the providers reported them (LangChain's
    `usage_metadata`, cached input in `input_token_details.cache_read`); written by
    `nodes.token_accounting.policy`. Calls that reported nothing are not in it."""

    turn_id: str | None
    """The turn `calls` and `turn` belong to: the id of its opening message."""
    calls: list[UsageMetadata]
    """That turn's reply calls, in order (a retried or fallback call once each)."""
    turn: NotRequired[UsageMetadata]
    """The sum of `calls` (absent when none reported usage)."""
    session: NotRequired[UsageMetadata]
    """The sum over every call of the session, whatever its purpose."""
    purposes: NotRequired[dict[str, UsageMetadata]]
    """The session's sum for each purpose of the loop's other model calls
    (`nodes.token_accounting.aside.Purpose`): `compaction`, `presence`, `extraction`, `vision`,
    `middleware`; the
    replies' is `session` less these."""


class TokenUsageState(LoopState):
    """The key token accounting keeps in a session."""

    token_usage: NotRequired[TokenUsage]
    """Tokens used per call, per turn and per session (absent until a provider reports any)."""
