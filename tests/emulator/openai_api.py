"""OpenAI Chat Completions as the emulator speaks it: the rules it enforces, its replies.

Rules (each answered with OpenAI's 400 body, `{"error": {"message", "type",
"param", "code"}}`, the messages as the API words them):

- the model exists (404 `model_not_found`), and takes `reasoning_effort` only
  if it reasons (400 `unsupported_parameter`; see `tests.emulator.models`);
- `stream_options` only with `stream` (API reference, "stream_options");
- tool results pair with calls (platform.openai.com/docs/guides/function-calling;
  the texts as seen in FoundationAgents/OpenManus#744 and microsoft/promptflow#3130):
  a `tool` message answers a call of the assistant message right before it
  (other tool messages between), and every call is answered before the next
  non-tool message;
- a call id is at most 40 characters (`string_above_max_length`);
- an assistant message has content or tool calls (docker/docker-agent#63).

OpenAI takes an empty user message and repeated call ids across messages, so
the emulator does too (`tests/payload_checks.py` holds the loop to the stricter
rule). Replies stream as the API streams them: the role first, text deltas,
each tool call's id and name in one chunk and its arguments in later ones, the
finish reason, then (with `stream_options.include_usage`) a usage chunk with
no choices, and `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from itertools import count as counter
from typing import Any

from tests.emulator.models import OPENAI_MODELS, lookup
from tests.emulator.script import Reply
from tests.emulator.tokens import PrefixCache, count, serialized
from tests.emulator.wire import ApiError, Frame, Request, event_frame, split

MAX_CALL_ID = 40
STATUS_ERRORS = {
    429: ("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


class OpenAIDialect:
    """Checks, usage and replies for `/v1/chat/completions`."""

    def __init__(self, ids: counter) -> None:
        self.ids = ids
        self.cache = PrefixCache()

    # -- rules -----------------------------------------------------------
    def check(self, request: Request) -> None:
        """Raise the `ApiError` the API answers `request` with, if any."""
        if not request.headers.get("authorization"):
            raise ApiError(401, "You didn't provide an API key.")
        body = request.payload
        model = lookup(OPENAI_MODELS, request.model)
        if model is None:
            raise ApiError(
                404,
                f"The model `{request.model}` does not exist or you do not have access to it.",
                code="model_not_found",
            )
        if "reasoning_effort" in body and not model.reasons:
            raise ApiError(
                400,
                "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                param="reasoning_effort",
                code="unsupported_parameter",
            )
        if body.get("stream_options") and not body.get("stream"):
            raise ApiError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        check_messages(request.messages)

    # -- replies ---------------------------------------------------------
    def answer(self, request: Request, reply: Reply | None) -> dict[str, Any] | list[Frame]:
        """The reply as a JSON body, or as stream frames when the request streams."""
        assert reply is not None  # every request here generates
        calls = [self._call(c.id, c.name, c.args) for c in reply.calls]
        request.usage = self._usage(request, reply)
        base = {
            "id": f"chatcmpl-{next(self.ids)}",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": "fp_emulator",
        }
        if request.stream:
            return self._frames(request, base, reply.text, calls)
        message = {"role": "assistant", "content": reply.text or None, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(calls)}
        return {**base, "object": "chat.completion", "choices": [choice], "usage": request.usage}

    def _call(self, id: str | None, name: str, args: dict[str, Any]) -> dict[str, Any]:
        arguments = json.dumps(args, ensure_ascii=False)
        function = {"name": name, "arguments": arguments}
        return {"id": id or f"call_{next(self.ids):08d}", "type": "function", "function": function}

    def _usage(self, request: Request, reply: Reply) -> dict[str, Any]:
        """Usage as OpenAI reports it, the cached prefix included (`tokens.PrefixCache`)."""
        body = request.payload
        parts = [*(body.get("tools") or []), *request.messages]  # tools render first
        prompt = "".join(serialized(part) for part in parts)
        prompt_tokens, cached = self.cache.read(request.model, prompt)
        output = count(reply.text) + sum(
            count(serialized(c.args)) + count(c.name) for c in reply.calls
        )
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": output,
            "total_tokens": prompt_tokens + output,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }

    def _frames(
        self, request: Request, base: dict[str, Any], text: str, calls: list[dict[str, Any]]
    ) -> list[Frame]:
        """The reply as the API streams it; the usage chunk only when asked for."""
        with_usage = bool((request.payload.get("stream_options") or {}).get("include_usage"))
        head = {
            **base,
            "object": "chat.completion.chunk",
            **({"usage": None} if with_usage else {}),
        }

        def chunk(kind: str, delta: dict[str, Any], finish: str | None = None) -> Frame:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return event_frame(kind, {**head, "choices": [choice]})

        frames = [chunk("start", {"role": "assistant", "content": "", "refusal": None})]
        frames += [chunk("text", {"content": piece}) for piece in split(text)]
        frames += [
            chunk(kind, {"tool_calls": [delta]})
            for index, c in enumerate(calls)
            for kind, delta in call_deltas(index, c)
        ]
        frames.append(chunk("stop", {}, _finish(calls)))
        if with_usage:
            frames.append(event_frame("usage", {**head, "choices": [], "usage": request.usage}))
        return [*frames, Frame("done", "[DONE]")]

    # -- errors ----------------------------------------------------------
    @staticmethod
    def error_body(error: ApiError) -> dict[str, Any]:
        return {
            "error": {
                "message": error.message,
                "type": error.type,
                "param": error.param,
                "code": error.code,
            }
        }

    @staticmethod
    def status_error(status: int) -> ApiError:
        """What OpenAI answers with an injected status (429, 500, 503, …)."""
        message, kind, code = STATUS_ERRORS.get(status, STATUS_ERRORS[500])
        return ApiError(status, message, kind, code=code)


def check_messages(messages: list[dict[str, Any]]) -> None:
    """The message rules: pairing of tool calls and results, call ids, content."""
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    owner, unanswered = None, []  # the assistant message whose calls are open, and their ids
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            unanswered = answered(messages, i, owner, unanswered)
            continue
        if unanswered:
            raise unanswered_calls(owner, unanswered)
        owner, unanswered = None, []
        if message.get("role") == "assistant":
            calls = check_assistant(i, message)
            owner, unanswered = (i, [c["id"] for c in calls]) if calls else (None, [])
    if unanswered:
        raise unanswered_calls(owner, unanswered)


def answered(
    messages: list[dict[str, Any]], i: int, owner: int | None, open: list[str]
) -> list[str]:
    """The calls still open once tool message `i` is read."""
    if owner is None:
        raise ApiError(
            400,
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            param=f"messages.[{i}].role",
        )
    call_id = messages[i].get("tool_call_id")
    if call_id not in [c["id"] for c in messages[owner].get("tool_calls") or []]:
        raise ApiError(
            400,
            f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of "
            "previous message.",
            param=f"messages.[{i}].tool_call_id",
        )
    return [c for c in open if c != call_id]


def check_assistant(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's calls, once its content and call ids pass."""
    calls = message.get("tool_calls") or []
    if message.get("content") is None and not calls:
        raise ApiError(
            400,
            "Invalid value for 'content': expected a string, got null.",
            param=f"messages.[{i}].content",
        )
    for j, c in enumerate(calls):
        if len(str(c.get("id", ""))) > MAX_CALL_ID:
            raise ApiError(
                400,
                f"Invalid 'messages[{i}].tool_calls[{j}].id': string too long. Expected a string "
                f"with maximum length {MAX_CALL_ID}, but got a string with length "
                f"{len(c['id'])} instead.",
                param=f"messages[{i}].tool_calls[{j}].id",
                code="string_above_max_length",
            )
    return calls


def unanswered_calls(owner: int | None, ids: list[str]) -> ApiError:
    return ApiError(
        400,
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(ids)}",
        param=f"messages.[{owner}].role",
    )


def call_deltas(index: int, call: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A tool call as streamed: its id and name (no arguments yet), then the arguments in
    pieces, each (frame kind, delta)."""
    function = call["function"]
    named = {"name": function["name"], "arguments": ""}
    opening = {"index": index, "id": call["id"], "type": "function", "function": named}
    pieces = [
        {"index": index, "function": {"arguments": part}} for part in split(function["arguments"])
    ]
    return [("tool_start", opening), *(("tool_args", piece) for piece in pieces)]


def _finish(calls: list[dict[str, Any]]) -> str:
    return "tool_calls" if calls else "stop"
