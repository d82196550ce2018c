"""What a caller hooks into tool calls, and what the loop reports about them.

Plain data (no LangGraph): the hooks a caller installs (called through
`nodes.kernel.hooks.run_hook`) and the audit event a restricted denial produces.
The results that answer a call the loop does not run are in
`nodes.kernel.tool_results`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage

from nodes.core.env import SessionEnv


@dataclass(frozen=True)
class ToolHooks:
    """Optional per-batch and per-call hooks around tool execution.

    A hook that raises is logged and ignored: the turn goes on. Hooks may run
    again for the same call after a crash and resume (at-least-once), so keep
    them idempotent.

    Args:
        before_batch: `(calls, env)`, when a reply requests tool calls, before any runs.
        after_batch: `(calls, results, env)`, once every call of the batch has a result.
        before_call: `(call, env) -> reason | None`; a reason vetoes the call and
            the model gets a soft `vetoed: <reason>` error result instead. It
            cannot lift a restricted-session denial.
        after_call: `(call, result, env)`, after each call that ran.

    Example:
        >>> ToolHooks(before_call=lambda call, env: "只读模式" if call["name"] == "take_note" else None)
    """

    before_batch: Callable[[list[ToolCall], SessionEnv], None] | None = None
    after_batch: Callable[[list[ToolCall], list[ToolMessage], SessionEnv], None] | None = None
    before_call: Callable[[ToolCall, SessionEnv], str | None] | None = None
    after_call: Callable[[ToolCall, ToolMessage, SessionEnv], None] | None = None


@dataclass(frozen=True)
class AuditEvent:
    """A tool call refused in a restricted (group/stranger) session."""

    tool: str
    arguments: dict[str, Any]
    actor: str
    persona_id: str | None
    session_id: str | None
    turn_id: str | None
    reason: str
    tool_call_id: str
    time: float = field(default_factory=time.time)
    kind: str = "audit_tool_denied"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
