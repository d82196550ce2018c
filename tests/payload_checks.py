"""What the OpenAI and Anthropic APIs would refuse in a request, checked offline.

A view the graph sent to the (scripted) model is turned into each provider's
real request payload by its own LangChain formatter, then checked for the
pairing rules both APIs enforce: every tool call has a string id and is
answered by the messages right after it, and no tool result answers a call
that is not there. Ids are checked as the stricter API takes them: unique in
the whole request, `[a-zA-Z0-9_-]` only (Anthropic: "`tool_use` ids must be
unique", "String should match pattern"), at most 40 characters (OpenAI), so a
session can fall back from one provider to the other. An Anthropic request
may carry at most four `cache_control` breakpoints.
"""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.messages import BaseMessage
from langchain_openai import ChatOpenAI

OPENAI = ChatOpenAI(model="gpt-4o-mini", api_key="offline")
CALL_ID = re.compile(r"[a-zA-Z0-9_-]{1,40}")


def id_problems(ids: list[Any]) -> list[str]:
    """Call ids of a whole request that one of the APIs would refuse."""
    bad = [i for i in ids if not isinstance(i, str) or not CALL_ID.fullmatch(i)]
    repeated = sorted({i for i in ids if isinstance(i, str) and ids.count(i) > 1})
    return [f"unusable call ids {bad}"] * bool(bad) + [f"call ids used twice {repeated}"] * bool(
        repeated
    )


ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="offline")


def openai_problems(view: list[BaseMessage]) -> list[str]:
    """Pairing errors in the OpenAI chat-completions payload of `view` ([] when valid)."""
    problems: list[str] = []
    open_ids: set[str] = set()
    payload = OPENAI._get_request_payload(view)["messages"]
    problems += id_problems([c.get("id") for m in payload for c in m.get("tool_calls") or []])
    for i, message in enumerate(payload):
        if message["role"] == "tool":
            if message.get("tool_call_id") not in open_ids:
                problems.append(f"message {i}: tool result for unknown call {message}")
            open_ids.discard(message.get("tool_call_id"))
            continue
        if open_ids:
            problems.append(f"message {i}: calls {sorted(open_ids)} unanswered")
            open_ids = set()
        ids = [c.get("id") for c in message.get("tool_calls") or []]
        if any(not isinstance(c, str) or not c for c in ids) or len(set(ids)) != len(ids):
            problems.append(f"message {i}: bad tool call ids {ids}")
        if any(not c["function"].get("name") for c in message.get("tool_calls") or []):
            problems.append(f"message {i}: a tool call without a name")
        open_ids = {c for c in ids if isinstance(c, str)}
    if open_ids:
        problems.append(f"calls {sorted(open_ids)} unanswered at the end")
    return problems


def _blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message["content"]
    return [b for b in content if b.get("type") == kind] if isinstance(content, list) else []


def anthropic_problems(view: list[BaseMessage]) -> list[str]:
    """Pairing errors in the Anthropic messages payload of `view` ([] when valid)."""
    problems: list[str] = []
    payload = ANTHROPIC._get_request_payload(view)
    messages = payload["messages"]
    problems += id_problems([b["id"] for m in messages for b in _blocks(m, "tool_use")])
    if (marks := json.dumps(payload).count('"cache_control"')) > 4:
        problems.append(f"{marks} cache_control breakpoints (Anthropic takes at most 4)")
    for i, message in enumerate(messages):
        results = [b["tool_use_id"] for b in _blocks(message, "tool_result")]
        previous = messages[i - 1] if i else None
        uses = [b["id"] for b in _blocks(previous, "tool_use")] if previous else []
        if message["role"] == "user" and set(results) - set(uses):
            problems.append(f"message {i}: results {sorted(set(results) - set(uses))} unmatched")
        if results and isinstance(message["content"], list):
            kinds = [b.get("type") for b in message["content"]]
            if kinds[: len(results)] != ["tool_result"] * len(results):
                problems.append(f"message {i}: tool results must come first, got {kinds}")
        if message["role"] != "assistant":
            continue
        ids = [b["id"] for b in _blocks(message, "tool_use")]
        if any(not isinstance(c, str) or not c for c in ids) or len(set(ids)) != len(ids):
            problems.append(f"message {i}: bad tool_use ids {ids}")
        following = messages[i + 1] if i + 1 < len(messages) else None
        answered = (
            {b["tool_use_id"] for b in _blocks(following, "tool_result")} if following else set()
        )
        if missing := set(ids) - answered:
            problems.append(f"message {i}: tool_use {sorted(missing)} unanswered")
    return problems


def payload_problems(provider: str, view: list[BaseMessage]) -> list[str]:
    """Pairing errors in the payload `provider`'s formatter builds from `view`."""
    return {"openai": openai_problems, "anthropic": anthropic_problems}[provider](view)
