"""Recorded wire requests back as LangChain views, so `tests/payload_checks.py` can judge
the emulator's traffic with the checks it runs on scripted models' views.

OpenAI messages go through `langchain-openai`'s own dict converter. Anthropic
has none, so `anthropic_view` rebuilds the messages its formatter would have
sent them from: the system text, assistant content with `tool_use` blocks as
tool calls, and tool results as `ToolMessage`s before the user's own blocks.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_openai.chat_models.base import _convert_dict_to_message

from tests.emulator.anthropic_rules import blocks_of
from tests.emulator.wire import Request
from tests.payload_checks import payload_problems


def view_of(request: Request) -> list[BaseMessage]:
    """The LangChain messages a recorded generation request was formatted from."""
    if request.provider == "openai":
        return [_convert_dict_to_message(message) for message in request.messages]
    return anthropic_view(request.payload)


def anthropic_view(body: dict[str, Any]) -> list[BaseMessage]:
    system = body.get("system")
    view: list[BaseMessage] = [SystemMessage(system)] if system else []
    for message in body.get("messages") or []:
        blocks = blocks_of(message.get("content"))
        if message.get("role") == "assistant":
            view.append(assistant(blocks))
            continue
        view += [
            ToolMessage(b.get("content") or "", tool_call_id=b["tool_use_id"])
            for b in blocks
            if b.get("type") == "tool_result"
        ]
        if rest := [b for b in blocks if b.get("type") != "tool_result"]:
            view.append(HumanMessage(rest))
    return view


def assistant(blocks: list[dict[str, Any]]) -> AIMessage:
    """An assistant message: its `tool_use` blocks as tool calls, the rest as content."""
    calls = [
        {"name": b["name"], "args": b.get("input") or {}, "id": b["id"], "type": "tool_call"}
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    content = [b for b in blocks if b.get("type") != "tool_use"]
    return AIMessage(content or "", tool_calls=calls)


def traffic_problems(requests: list[Request]) -> dict[int, list[str]]:
    """`payload_checks`' problems with each recorded generation request, by request number
    (requests without problems left out)."""
    found = {
        r.number: payload_problems(str(r.provider), view_of(r)) for r in requests if r.generates
    }
    return {number: problems for number, problems in found.items() if problems}
