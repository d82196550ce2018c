"""Middleware `wrap_tool_call`s around each tool call, the first outermost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from nodes.middleware.hooks import overrides

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware
    from langgraph.prebuilt.tool_node import ToolCallRequest

Execute = Callable[["ToolCallRequest"], Any]
AExecute = Callable[["ToolCallRequest"], Awaitable[Any]]


def wrapped_execute(middleware: Sequence[AgentMiddleware], execute: Execute) -> Execute:
    """`execute` inside each middleware's `wrap_tool_call`."""
    for each in reversed([m for m in middleware if overrides(m, "wrap_tool_call")]):
        execute = partial(each.wrap_tool_call, handler=execute)
    return execute


def awrapped_execute(middleware: Sequence[AgentMiddleware], execute: AExecute) -> AExecute:
    """`execute` inside each middleware's `awrap_tool_call` (one with only the sync form
    fails its calls as LangChain's own agent does: no async form to run)."""
    wrapping = [
        m for m in middleware if overrides(m, "awrap_tool_call") or overrides(m, "wrap_tool_call")
    ]
    for each in reversed(wrapping):
        execute = partial(each.awrap_tool_call, handler=execute)
    return execute
