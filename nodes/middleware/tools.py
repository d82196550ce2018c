"""Middleware `wrap_tool_call`s around each tool call, the first outermost."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from nodes.middleware.hooks import overrides

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware

Wrap = Callable[..., Any]
"""A middleware's `wrap_tool_call` or `awrap_tool_call`: `(request, handler)`."""


def tool_wrappers(middleware: Sequence[AgentMiddleware]) -> tuple[list[Wrap], list[Wrap]]:
    """The `wrap_tool_call`s and the `awrap_tool_call`s that wrap each call, first outermost,
    chosen once when the node is built. A middleware with only the sync form is in the async
    list too: its call fails there as in LangChain's own agent (no async form to run)."""
    sync = [m.wrap_tool_call for m in middleware if overrides(m, "wrap_tool_call")]
    asynchronous = [
        m.awrap_tool_call
        for m in middleware
        if overrides(m, "awrap_tool_call") or overrides(m, "wrap_tool_call")
    ]
    return sync, asynchronous


def around(wrappers: Sequence[Wrap], execute: Callable[..., Any]) -> Callable[..., Any]:
    """`execute` inside `wrappers`, the first outermost."""
    for wrap in reversed(wrappers):
        execute = partial(wrap, handler=execute)
    return execute
