"""Replies that cannot run as they are: cut off, unparseable calls, missing or repeated ids.

Plain functions (no LangGraph), applied to every reply before anything runs:

- `with_stable_call_ids`: a tool call with no id, an id already used in the
  same reply or earlier in the request, or an id another provider would
  refuse, gets one derived from the reply's id and its position, so its
  result can be paired with it (a `ToolMessage` needs an id, and providers
  reject duplicates).
- `ended_unsaid`: a stream that broke off before the provider said why the
  reply stopped; the model call raises it as a transient `MalformedReply`.
- `unique_call_ids`: the same for the stored replies a request carries, so a
  history imported twice does not repeat its call ids.
- `is_cut_off`: the provider ended the reply before the model did: at the
  output limit (OpenAI `finish_reason="length"`, Anthropic
  `stop_reason="max_tokens"`, Gemini `finish_reason="MAX_TOKENS"`), or by
  its content filter (`content_filter`, `refusal`, Gemini's `SAFETY` and
  kin). Its tool calls are never run, even when their arguments parse:
  what parsed may be a prefix of what the model meant, and a stranger in a
  group chat can steer a reply into the filter on purpose.
- `closing_results`: the error results the loop itself answers such calls
  with, and every entry of `invalid_tool_calls` (arguments that did not
  parse). Both provider formatters send invalid calls as calls, so an
  unanswered one would make every later request fail.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeGuard

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    ToolCall,
    ToolMessage,
)

from nodes.kernel.tool_results import invalid_call_result, truncated_result

LIMIT_REASONS = frozenset(
    {"length", "max_tokens", "max_output_tokens", "model_context_window_exceeded"}
)
"""Stop reasons meaning "the output limit was hit", lower-cased across providers."""
FILTER_REASONS = frozenset(
    {
        "content_filter",  # OpenAI
        "refusal",  # Anthropic
        *("safety", "recitation", "blocklist", "prohibited_content", "spii", "image_safety"),
        "malformed_function_call",  # Gemini: the call it was writing did not hold together
    }
)
"""Stop reasons meaning "the provider stopped the reply" (filters and the like)."""
CUT_OFF_REASONS = LIMIT_REASONS | FILTER_REASONS
"""Every stop reason after which a reply's calls never run (`is_cut_off`, on every route)."""
STOP_REASON_KEYS = ("finish_reason", "stop_reason", "done_reason")
"""`response_metadata` keys: OpenAI and Gemini, Anthropic, Ollama."""
UNNAMED_TOOL = "unnamed_tool"
"""Name given to an unparseable call that has none (providers need one to pair its result)."""
CALL_BLOCK_TYPES = frozenset({"tool_use", "tool_call"})
"""Content blocks that repeat a call's id (Anthropic's native blocks, LangChain's v1 blocks)."""


def stop_reason(message: BaseMessage) -> str | None:
    """Why the provider stopped generating, lower-cased, or None when it did not say."""
    meta = message.response_metadata
    for key in STOP_REASON_KEYS:
        if value := meta.get(key):
            return str(getattr(value, "name", value)).lower()  # Gemini may hand over an enum
    details = meta.get("incomplete_details")  # OpenAI's Responses API
    if isinstance(details, Mapping) and details.get("reason"):
        return str(details["reason"]).lower()
    return None


ENDING_KEYS = {"openai": ("finish_reason", "status"), "anthropic": ("stop_reason",)}
"""By `response_metadata["model_provider"]`, the keys one of which a whole answer always
sets: how Chat Completions (`finish_reason`), the Responses API (`status`) and Messages
(`stop_reason`) end. LangChain sets them from a stream's last events only."""


def ended_unsaid(message: BaseMessage) -> bool:
    """Whether an OpenAI or Anthropic reply never said why it stopped: its stream broke off
    before its last event (no `finish_reason` chunk, no `message_delta`)."""
    meta = message.response_metadata
    keys = ENDING_KEYS.get(str(meta.get("model_provider")), ())
    return bool(keys) and not any(key in meta for key in keys)


def is_cut_off(message: BaseMessage) -> bool:
    """Whether the provider ended the reply (output limit, content filter) rather than the model."""
    return stop_reason(message) in CUT_OFF_REASONS


CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""A call id every provider takes: Anthropic's pattern, OpenAI's 40-character cap."""


def stable_call_id(reply_id: str, index: int, taken: Collection[str] = ()) -> str:
    """A call id derived from the reply, the call's position and the ids already taken:
    the same inputs, the same id.

    Short and `[A-Za-z0-9_]` only, which every provider accepts (OpenAI caps ids at 40).
    """
    seeds = (f"{reply_id}#{index}" + (f"#{n}" if n else "") for n in itertools.count())
    derived = (f"call_{hashlib.sha256(seed.encode()).hexdigest()[:24]}" for seed in seeds)
    return next(call_id for call_id in derived if call_id not in taken)


def requested_calls(message: AIMessage) -> list[ToolCall | InvalidToolCall]:
    """Every call a reply asked for, parseable or not: each needs a result before the next
    message, because the provider formatters send unparseable calls as calls too."""
    return [*message.tool_calls, *message.invalid_tool_calls]


def _asks_calls(message: Any) -> bool:
    """Whether a reply (of exactly `AIMessage`'s type) asks for a call, parseable or not."""
    return bool(message.tool_calls or message.invalid_tool_calls)


def call_ids(messages: Sequence[BaseMessage]) -> set[str]:
    """The id of every call the messages' replies asked for, parseable or not."""
    return {
        call_id
        for m in messages
        if type(m) is not HumanMessage and isinstance(m, AIMessage)  # most are people's words
        for c in requested_calls(m)
        if (call_id := c.get("id"))
    }


def usable_call_id(call_id: object) -> TypeGuard[str]:
    """Whether every provider takes `call_id` as it is (`CALL_ID`)."""
    return isinstance(call_id, str) and CALL_ID.fullmatch(call_id) is not None


def with_stable_call_ids(reply: AIMessage, request: Sequence[BaseMessage] = ()) -> AIMessage:
    """The reply with a usable, unique id on every call, valid or not (the reply itself if
    all had one).

    The first call to use an id keeps it, unless a message of the `request`
    the reply answers already holds it (providers refuse a request that repeats
    an id, and a provider that numbers calls `call_0` in every reply would
    otherwise break the session for good) or another provider would refuse it
    (`CALL_ID`: a fallback model must be able to read the session). Any other
    id is replaced by `stable_call_id`, and the matching content block is
    patched alike. An unparseable call without a name gets `UNNAMED_TOOL`.
    """
    return _calls_made_unique(reply, call_ids(request))


def _calls_made_unique(reply: AIMessage, taken: Collection[str]) -> AIMessage:
    """`with_stable_call_ids` against the ids in `taken`."""
    calls: Sequence[Mapping[str, Any]] = requested_calls(reply)
    if not calls:
        return reply
    ids = [c.get("id") for c in calls]
    if (
        all(usable_call_id(i) and i not in taken for i in ids)
        and len(set(ids)) == len(ids)
        and all(c.get("name") for c in calls)
    ):
        return reply
    reply_id = reply.id or f"run-{uuid.uuid4()}"
    used: set[str] = set(taken)
    kept: set[str] = set()
    renamed: list[tuple[str | None, str]] = []
    fixed: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        call_id = call.get("id")
        if usable_call_id(call_id) and call_id not in used:
            kept.add(call_id)
        else:
            call_id = stable_call_id(reply_id, index, used)
            renamed.append((call.get("id"), call_id))
        used.add(call_id)
        fixed.append({**call, "id": call_id, "name": call.get("name") or UNNAMED_TOOL})
    valid = len(reply.tool_calls)
    return reply.model_copy(
        update={
            "id": reply_id,
            "tool_calls": fixed[:valid],
            "invalid_tool_calls": fixed[valid:],
            "content": _renamed_blocks(reply.content, renamed, kept),
        }
    )


def unique_call_ids(conversation: Sequence[BaseMessage]) -> list[BaseMessage]:
    """`conversation` with no call id used twice, as providers require of a request
    (Anthropic: "tool_use ids must be unique"). A stored reply whose call holds an earlier
    call's id (a history imported twice, an application numbering its calls `call_1` in
    every import) gets the stable id `with_stable_call_ids` gives a new reply's call, and
    the result answering that call follows it. The same on every round, so a provider's
    cached prefix still matches."""
    taken: set[str] = set()
    answering: list[tuple[str | None, str | None]] = []
    """For the last reply's calls, in order: the id a result carries, the id it answers."""
    out: list[BaseMessage] = []
    for message in conversation:
        kind = type(message)
        if kind is HumanMessage or (kind is AIMessage and not _asks_calls(message)):
            out.append(message)  # most of a chat: neither asks for a call nor answers one
            continue
        if isinstance(message, ToolMessage):
            match = next((pair for pair in answering if pair[0] == message.tool_call_id), None)
            if match is not None:
                answering.remove(match)
                if match[1] != match[0]:
                    message = message.model_copy(update={"tool_call_id": match[1]})
        elif isinstance(message, AIMessage) and (calls := requested_calls(message)):
            unique = _calls_made_unique(message, taken)
            renamed = requested_calls(unique)
            answering = [
                (old.get("id"), new.get("id")) for old, new in zip(calls, renamed, strict=True)
            ]
            taken.update(str(call.get("id")) for call in renamed)
            message = unique
        out.append(message)
    return out


def _renamed_blocks(
    content: str | list, renamed: list[tuple[str | None, str]], kept: set[str]
) -> str | list:
    """Content blocks of calls carry the new ids too, matched the way the calls were: a
    block whose id a call kept keeps it the first time only."""
    if isinstance(content, str) or not renamed:
        return content
    pending, seen, out = list(renamed), set(), []
    for block in content:
        if isinstance(block, dict) and block.get("type") in CALL_BLOCK_TYPES:
            old = block.get("id")
            match = next((p for p in pending if p[0] == old), None)
            if (old not in kept or old in seen) and match is not None:
                pending.remove(match)
                block = {**block, "id": match[1]}
            seen.add(block.get("id"))
        out.append(block)
    return out


def closing_results(reply: AIMessage) -> list[ToolMessage]:
    """Error results for the calls the loop answers instead of running them.

    A cut-off reply's calls, all of them, saying why it stopped; otherwise every
    unparseable call, carrying its parse error. Expects ids made stable first.
    """
    if is_cut_off(reply):
        reason = stop_reason(reply)
        filtered = reason if reason in FILTER_REASONS else None
        return [truncated_result(c, filtered=filtered) for c in reply.tool_calls] + [
            truncated_result(c, c.get("error"), filtered) for c in reply.invalid_tool_calls
        ]
    return [invalid_call_result(c, c.get("error")) for c in reply.invalid_tool_calls]
