"""Who may run which tool call, and what the loop reports about it.

Plain data and functions (no LangGraph): the hooks a caller installs, the
audit event a restricted denial produces, and the soft error results that keep
every tool call paired with a result even when it is not executed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage

from nodes.env import SessionEnv

log = logging.getLogger("cyrene.tools")

NOT_ALLOWED = "not_allowed"
ROUND_LIMIT = "round_limit"
VETOED = "vetoed"
TRUNCATED = "truncated"
INVALID_TOOL_CALL = "invalid_tool_call"
SOFT_ERROR_CODES = (NOT_ALLOWED, ROUND_LIMIT, VETOED, TRUNCATED, INVALID_TOOL_CALL)


@dataclass(frozen=True)
class ToolHooks:
    """Optional per-batch and per-call hooks around tool execution (the seed's `ToolLoopHooks`).

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


def run_hook(name: str, hook: Callable[..., Any] | None, *args: Any) -> Any:
    """Call a hook, logging (not raising) its failure."""
    if hook is None:
        return None
    try:
        return hook(*args)
    except Exception:
        log.exception("tool hook %s failed; the turn goes on", name)
        return None


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


def soft_error(call: Mapping[str, Any], code: str, detail: str) -> ToolMessage:
    """An error result for a call that was not executed; `code` leads the text."""
    return ToolMessage(
        content=f"{code}: {detail}",
        tool_call_id=call["id"],
        name=call["name"],
        status="error",
    )


def was_executed(result: ToolMessage) -> bool:
    """False for the soft results of calls the loop refused to run."""
    text = result.content if isinstance(result.content, str) else ""
    return not (result.status == "error" and text.startswith(SOFT_ERROR_CODES))


def denied_in_restricted(call: ToolCall) -> ToolMessage:
    return soft_error(
        call,
        NOT_ALLOWED,
        f"tool {call['name']!r} is not available in group or stranger sessions.",
    )


def round_limit_result(call: ToolCall, max_rounds: int) -> ToolMessage:
    return soft_error(
        call,
        ROUND_LIMIT,
        f"this turn reached its limit of {max_rounds} model calls; the call was not run.",
    )


def vetoed_result(call: ToolCall, reason: str) -> ToolMessage:
    return soft_error(call, VETOED, reason)


def truncated_result(
    call: Mapping[str, Any], parse_error: str | None = None, filtered: str | None = None
) -> ToolMessage:
    """A call from a reply the provider cut off (at the output limit, or with `filtered`, the
    stop reason of its content filter): never run; the model may issue it again."""
    unparsed = f" Its arguments did not parse: {parse_error}." if parse_error else ""
    if filtered is None:
        why, again = (
            "cut off at the output token limit",
            "Issue the call again (keep the reply short).",
        )
    else:
        why, again = (
            f"stopped by the provider ({filtered})",
            "Issue it again only if it is still needed.",
        )
    return soft_error(
        call,
        TRUNCATED,
        f"your reply was {why} before this call was complete, so it was not run.{unparsed} {again}",
    )


def invalid_call_result(call: Mapping[str, Any], parse_error: str | None) -> ToolMessage:
    """A call whose arguments did not parse: never run, the parse error goes back to the model."""
    return soft_error(
        call,
        INVALID_TOOL_CALL,
        f"the arguments of this call could not be parsed ({parse_error or 'unknown error'}), "
        "so it was not run. Issue the call again with valid JSON arguments.",
    )
