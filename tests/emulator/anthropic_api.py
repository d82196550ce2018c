"""Anthropic Messages as the emulator speaks it: `/v1/messages` and its token counter.

The rules are `tests.emulator.anthropic_rules`; errors come as the API sends
them, `{"type": "error", "error": {"type", "message"}}`, with
`x-should-retry: false` on a 4xx. A reply with thinking enabled opens with a
signed thinking block. A stream is the API's event sequence: `message_start`
(with the input usage), a `ping`, then per block `content_block_start`, its
deltas (`thinking_delta` + `signature_delta`, `text_delta`, or the tool
input as `input_json_delta` pieces) and `content_block_stop`; then
`message_delta` (the stop reason, and the whole usage: today's API repeats the
input counts there, and LangChain reads them from it) and `message_stop`.
"""

from __future__ import annotations

from itertools import count as counter
from typing import Any

from tests.cache_share import _canonical, _text
from tests.emulator.anthropic_rules import blocks_of, check_request, sign
from tests.emulator.models import ANTHROPIC_MODELS, Model, lookup
from tests.emulator.script import Reply
from tests.emulator.tokens import BreakpointCache, CacheUse, count, serialized
from tests.emulator.wire import ApiError, Frame, Request, event_frame, split

DEFAULT_THINKING = "先想一想该怎么回答。"
EMPTY = {
    "thinking": {"thinking": "", "signature": ""},
    "text": {"text": ""},
    "tool_use": {"input": {}},
}
"""What each kind of block holds when its `content_block_start` opens it."""
STATUS_ERRORS = {
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


class AnthropicDialect:
    """Checks, usage and replies for `/v1/messages` and `/v1/messages/count_tokens`."""

    def __init__(self, ids: counter) -> None:
        self.ids = ids
        self.cache = BreakpointCache()

    # -- rules -----------------------------------------------------------
    def check(self, request: Request) -> None:
        """Raise the `ApiError` the API answers `request` with, if any."""
        if not (request.headers.get("x-api-key") or request.headers.get("authorization")):
            raise ApiError(401, "x-api-key header is required", "authentication_error")
        if not request.headers.get("anthropic-version"):
            raise ApiError(400, "anthropic-version: header is required")
        body = request.payload
        if request.generates and "max_tokens" not in body:
            raise ApiError(400, "max_tokens: Field required")
        check_request(body, self.model(request), request.generates)

    @staticmethod
    def model(request: Request) -> Model:
        model = lookup(ANTHROPIC_MODELS, request.model)
        if model is None:
            raise ApiError(404, f"model: {request.model}", "not_found_error")
        return model

    # -- replies ---------------------------------------------------------
    def answer(self, request: Request, reply: Reply | None) -> dict[str, Any] | list[Frame]:
        """The reply (a token count for the counter) as a body, or as stream frames."""
        if reply is None:
            return {"input_tokens": sum(count(unit) for unit in units(request.payload)[0])}
        content = self._content(request, reply)
        output = sum(count(serialized(block)) for block in content)
        use = self._cache_use(request)
        request.usage = usage(use, output)
        message = {
            "id": f"msg_{next(self.ids):08d}",
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": content,
            "stop_reason": "tool_use" if reply.calls else "end_turn",
            "stop_sequence": None,
            "usage": request.usage,
        }
        return frames(message, usage(use, 1)) if request.stream else message

    def _content(self, request: Request, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if (request.payload.get("thinking") or {}).get("type") == "enabled":
            thought = reply.thinking or DEFAULT_THINKING
            blocks.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        blocks += [
            {
                "type": "tool_use",
                "id": c.id or f"toolu_{next(self.ids):08d}",
                "name": c.name,
                "input": c.args,
            }
            for c in reply.calls
        ]
        return blocks

    def _cache_use(self, request: Request) -> CacheUse:
        cached, marks = units(request.payload)
        minimum = self.model(request).cache_minimum
        return self.cache.use(request.model, cached, marks, minimum)

    # -- errors ----------------------------------------------------------
    @staticmethod
    def error_body(error: ApiError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error.type, "message": error.message}}

    @staticmethod
    def status_error(status: int) -> ApiError:
        """What Anthropic answers with an injected status (429, 500, 529, …)."""
        kind, message = STATUS_ERRORS.get(status, STATUS_ERRORS[500])
        return ApiError(status, message, kind)


def units(body: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The request's blocks in cache order (tools, system, messages) as canonical JSON, and
    which of them carry a breakpoint."""
    system = body.get("system") or []
    parts = [("tool", tool) for tool in body.get("tools") or []]
    parts += [("system", b) for b in ([_text(system)] if isinstance(system, str) else system)]
    for message in body.get("messages") or []:
        parts += [(message.get("role"), b) for b in blocks_of(message.get("content"))]
    return (
        [serialized([role, _canonical(block)]) for role, block in parts],
        [i for i, (_, block) in enumerate(parts) if "cache_control" in block],
    )


def usage(use: CacheUse, output: int) -> dict[str, Any]:
    """Usage as Anthropic reports it: `input_tokens` excludes what was read or written."""
    return {
        "input_tokens": use.uncached,
        "cache_creation_input_tokens": use.written,
        "cache_read_input_tokens": use.read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": use.written,
            "ephemeral_1h_input_tokens": 0,
        },
        "output_tokens": output,
        "service_tier": "standard",
    }


def frames(message: dict[str, Any], opening: dict[str, Any]) -> list[Frame]:
    """`message` as the API streams it (`opening`: the usage `message_start` reports)."""
    start = {**message, "content": [], "stop_reason": None, "usage": opening}
    out = [
        event("start", {"type": "message_start", "message": start}),
        event("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        out += block_frames(index, block)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    final = {"type": "message_delta", "delta": delta, "usage": message["usage"]}  # cumulative
    return [*out, event("stop", final), event("done", {"type": "message_stop"})]


def block_frames(index: int, block: dict[str, Any]) -> list[Frame]:
    """One content block's start (empty, as the API opens it), deltas and stop."""
    opening = {**block, **EMPTY[block["type"]]}
    start = {"type": "content_block_start", "index": index, "content_block": opening}
    out = [event("tool_start" if block["type"] == "tool_use" else "start", start)]
    out += [
        event(kind, {"type": "content_block_delta", "index": index, "delta": delta})
        for kind, delta in block_deltas(block)
    ]
    return [*out, event("block_stop", {"type": "content_block_stop", "index": index})]


def block_deltas(block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(frame kind, delta) pairs that rebuild a block: text and thinking in pieces (then the
    thinking's signature), a tool call's input as pieces of its JSON."""
    if block["type"] == "thinking":
        pieces = [
            ("thinking", {"type": "thinking_delta", "thinking": p})
            for p in split(block["thinking"])
        ]
        return [*pieces, ("thinking", {"type": "signature_delta", "signature": block["signature"]})]
    if block["type"] == "text":
        return [("text", {"type": "text_delta", "text": p}) for p in split(block["text"])]
    partial = serialized(block["input"]) if block["input"] else ""
    return [("tool_args", {"type": "input_json_delta", "partial_json": p}) for p in split(partial)]


def event(kind: str, payload: dict[str, Any]) -> Frame:
    """A frame named, as the API names its events, after the payload's type."""
    return event_frame(kind, payload, payload["type"])
