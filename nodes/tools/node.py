"""`dispatch_tools`: run one requested tool call per task, under the loop's policy.

The node is LangGraph's own `ToolNode` (argument validation, unknown tools and
exceptions become error results), fed one call per `Send` as `create_agent`
does — so a crash mid-batch re-runs only the calls that had not finished. The
policy wraps each call: restricted sessions refuse anything outside
`restricted_tools` with a soft `not_allowed` result and an audit event (a hard
boundary that capacity, hooks and the model cannot lift), then `before_call`
may veto, then the call runs (inside each middleware's `wrap_tool_call`) and
`after_call` sees the result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    TOOL_CALL_ERROR_TEMPLATE,
    ToolCallRequest,
    ToolInvocationError,
)
from langgraph.types import Command

from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.kernel.hooks import run_hook
from nodes.kernel.steps import off_loop
from nodes.kernel.tool_results import denied_in_restricted, vetoed_result
from nodes.middleware.tools import around, tool_wrappers
from nodes.tools.hooks import AuditEvent
from nodes.tools.settings import ToolCalls

ToolOutcome = ToolMessage | Command


def audit_denial(loop: Loop, request: ToolCallRequest, env: SessionEnv) -> None:
    """Report a restricted-session denial to `on_audit` and the custom stream."""
    call, runtime = request.tool_call, request.runtime
    state = request.state if isinstance(request.state, dict) else {}
    event = AuditEvent(
        tool=call["name"],
        arguments=dict(call.get("args") or {}),
        actor=env.actor,
        persona_id=loop.persona_for(env),
        session_id=loop.session_id(env, runtime.config),
        turn_id=loop.turn_id(env, state.get("messages", [])),
        reason="tool not in restricted_tools",
        tool_call_id=str(call["id"]),  # ids are made stable before any call runs
    )
    run_hook("on_audit", loop.feature(ToolCalls).on_audit, event)
    if runtime.stream_writer is not None:
        runtime.stream_writer(event.to_dict())


def restricted_refusal(loop: Loop, request: ToolCallRequest) -> ToolMessage | None:
    """The `not_allowed` result (and its audit event) for a restricted session's call of a
    tool outside `restricted_tools`, by the call's name or the tool it would run."""
    env, call = env_of(request.runtime), request.tool_call
    allowed = loop.config.restricted_tools
    tool = getattr(request.tool, "name", call["name"])
    if env.restricted and (call["name"] not in allowed or tool not in allowed):
        audit_denial(loop, request, env)
        return denied_in_restricted(call)
    return None


def refusal(loop: Loop, request: ToolCallRequest) -> ToolMessage | None:
    """The soft result replacing a call the loop will not run, or None to run it."""
    if (denied := restricted_refusal(loop, request)) is not None:
        return denied
    call, env = request.tool_call, env_of(request.runtime)
    reason = run_hook("before_call", loop.feature(ToolCalls).hooks.before_call, call, env)
    return vetoed_result(call, str(reason)) if reason else None


def report_call(loop: Loop, request: ToolCallRequest, result: ToolOutcome) -> None:
    """`after_call` sees every call that ran, with its result."""
    run_hook(
        "after_call",
        loop.feature(ToolCalls).hooks.after_call,
        request.tool_call,
        result,
        env_of(request.runtime),
    )


def invalid_arguments(error: ToolInvocationError) -> str:
    """What a call whose arguments do not validate gets, inside `ToolNode`; any other
    failure reaches the middleware around the call first (`ToolRetryMiddleware` retries
    it), then `failed_call`."""
    return TOOL_CALL_ERROR_TEMPLATE.format(error=repr(error))


def failed_call(request: ToolCallRequest, error: Exception) -> ToolMessage:
    """The error result of a call that raised: the model may try otherwise."""
    call = request.tool_call
    return ToolMessage(
        content=TOOL_CALL_ERROR_TEMPLATE.format(error=repr(error)),
        name=call["name"],
        tool_call_id=call["id"],
        status="error",
    )


def make_dispatch_tools(loop: Loop) -> ToolNode:
    """A `ToolNode` named `dispatch_tools` whose every call passes the loop's policy."""

    wraps, awraps = tool_wrappers(loop.config.middleware)

    def guarded(request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolOutcome]):
        if (refused := refusal(loop, request)) is not None:
            return refused

        def checked(handed: ToolCallRequest) -> ToolOutcome:
            # A middleware may hand on another call (a reviewer's edit): it is checked again.
            return restricted_refusal(loop, handed) or execute(handed)

        try:
            result = around(wraps, checked)(request)
        except GraphBubbleUp:
            raise
        except Exception as error:
            result = failed_call(request, error)
        report_call(loop, request, result)
        return result

    # Audit sinks and hooks are the caller's code: they may block (files, HTTP).
    settings = loop.feature(ToolCalls)
    hooks = settings.hooks
    audit_hops = settings.on_audit is not None
    vet_hops = audit_hops or hooks.before_call is not None
    report_hops = hooks.after_call is not None

    async def aguarded(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[ToolOutcome]]
    ):
        if (refused := await off_loop(vet_hops, refusal, loop, request)) is not None:
            return refused

        async def achecked(handed: ToolCallRequest) -> ToolOutcome:
            denied = await off_loop(audit_hops, restricted_refusal, loop, handed)
            return denied or await execute(handed)

        try:
            result = await around(awraps, achecked)(request)
        except GraphBubbleUp:
            raise
        except Exception as error:
            result = failed_call(request, error)
        await off_loop(report_hops, report_call, loop, request, result)
        return result

    return ToolNode(
        list(loop.tools_by_name.values()),
        name="dispatch_tools",
        handle_tool_errors=invalid_arguments,
        wrap_tool_call=guarded,
        awrap_tool_call=aguarded,
    )
