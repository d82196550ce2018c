"""How much of a request a provider's prompt cache can reuse, measured on the real payloads.

A model view is turned into the request payload by the provider's own
LangChain formatter (offline), then compared with the previous request's:

- OpenAI caches the longest prefix a request shares with one it has seen
  recently, by itself: the cacheable part is the prefix the payload's
  messages (as JSON, in characters) share with the previous request's.
- Anthropic caches up to `cache_control` breakpoints, and a request finds an
  entry by looking back up to 20 blocks from each of its own breakpoints: the
  cacheable part is the longest prefix that ends at one of the previous
  request's breakpoints (an entry it wrote), repeats it block for block, and
  lies at most 20 blocks before one of this request's breakpoints. Blocks are
  compared as the API defines them: string content (a message's, a tool
  result's) is shorthand for one text block, and the `cache_control` mark is
  not part of the prefix. (LangChain's formatter writes a marked message as
  blocks and the same message, unmarked in the next request, as a string;
  LangChain's own Anthropic caching middleware relies on the two being one
  prefix.) No breakpoint, no cache.

Tool definitions (the same in every request, and first in both providers'
order) are left out, which understates the share a little.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from langchain_core.messages import BaseMessage

from tests.payload_checks import ANTHROPIC, OPENAI

ANTHROPIC_LOOKBACK = 20
"""Blocks Anthropic looks back from a breakpoint for an earlier cache entry."""


@dataclass(frozen=True)
class Payload:
    """A request as a list of units (JSON text) and the units that carry a breakpoint."""

    units: list[str]
    marks: list[int]

    @property
    def size(self) -> int:
        return sum(len(unit) for unit in self.units)


def openai_payload(view: Sequence[BaseMessage]) -> Payload:
    messages = OPENAI._get_request_payload(list(view))["messages"]
    return Payload([json.dumps(m, ensure_ascii=False) for m in messages], [])


def anthropic_payload(view: Sequence[BaseMessage]) -> Payload:
    """The payload's system and message blocks, normalised, and which of them are marked."""
    payload = ANTHROPIC._get_request_payload(list(view))
    system = payload.get("system") or []
    units = [("system", b) for b in ([_text(system)] if isinstance(system, str) else system)]
    for message in payload["messages"]:
        content = message["content"]
        blocks = [_text(content)] if isinstance(content, str) else content
        units += [(message["role"], block) for block in blocks]
    return Payload(
        [json.dumps([role, _canonical(block)], ensure_ascii=False) for role, block in units],
        [i for i, (_, block) in enumerate(units) if "cache_control" in block],
    )


def openai_cached(before: Payload, after: Payload) -> int:
    """Characters of `after` that repeat `before`'s prefix."""
    old, new = "".join(before.units), "".join(after.units)
    return next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
        min(len(old), len(new)),
    )


def anthropic_cached(before: Payload, after: Payload) -> int:
    """Characters of `after` up to the last of `before`'s breakpoints that it repeats and
    reaches from one of its own."""
    for mark in sorted(before.marks, reverse=True):
        repeats = after.units[: mark + 1] == before.units[: mark + 1]
        if repeats and any(mark <= own <= mark + ANTHROPIC_LOOKBACK for own in after.marks):
            return sum(len(unit) for unit in after.units[: mark + 1])
    return 0


def shares(views: Sequence[Sequence[BaseMessage]], provider: str) -> list[float]:
    """For each request after the first, the share of it the provider's cache can reuse."""
    measure, cached = {
        "openai": (openai_payload, openai_cached),
        "anthropic": (anthropic_payload, anthropic_cached),
    }[provider]
    payloads = [measure(view) for view in views]
    return [cached(a, b) / b.size for a, b in pairwise(payloads)]


def repeated(views: Sequence[Sequence[BaseMessage]], provider: str) -> list[float]:
    """For each request after the first, the share that repeats the previous request's
    prefix character for character, breakpoints or not."""
    measure = openai_payload if provider == "openai" else anthropic_payload
    payloads = [measure(view) for view in views]
    return [openai_cached(a, b) / b.size for a, b in pairwise(payloads)]


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _canonical(block: dict[str, Any]) -> dict[str, Any]:
    """The block without its mark, a tool result's string content as one text block."""
    canonical = {k: v for k, v in block.items() if k != "cache_control"}
    if block.get("type") == "tool_result" and isinstance(block.get("content"), str):
        canonical["content"] = [_text(block["content"])]
    return canonical
