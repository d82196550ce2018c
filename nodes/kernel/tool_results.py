"""The soft error results that answer a tool call the loop does not run.

Every call keeps a result, so no provider ever sees an unanswered call: a call
refused in a restricted session, vetoed by a hook, past the round limit, from
a reply the provider cut off, or whose arguments did not parse. Each result's
text starts with its code, which is how `was_executed` tells them from results
of calls that ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage

NOT_ALLOWED = "not_allowed"
ROUND_LIMIT = "round_limit"
VETOED = "vetoed"
TRUNCATED = "truncated"
INVALID_TOOL_CALL = "invalid_tool_call"
SOFT_ERROR_CODES = (NOT_ALLOWED, ROUND_LIMIT, VETOED, TRUNCATED, INVALID_TOOL_CALL)


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
