"""Admitting a run's messages: human messages from anyone, system and assistant text from the
application only (`nodes.boundary.admission.Trusted`), every one rebuilt from what it may carry.

Part of the boundary (`nodes.boundary.admission`): each message is rebuilt from
its content, name and id alone, its display name normalised, its images made
the one block shape every provider renders (or a placeholder), and an
assistant's tool calls checked to be answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    convert_to_messages,
)

from nodes.kernel.images import IMAGE_BLOCK_TYPES, MAX_IMAGE_BYTES, normalise_image
from nodes.kernel.messages import message_text
from nodes.kernel.replies import usable_call_id
from nodes.kernel.sanitize import UNNAMED_MEMBER, check_id, display_name
from nodes.kernel.text import clean_text, is_blank, single_line
from nodes.kernel.transcript import (
    RESTRICTED,
    SAID_AT,
    annotated,
    annotation_metadata,
    annotations_of,
    said_at,
)
from nodes.presence.mentions import MENTIONED


@dataclass(frozen=True)
class Rules:
    """How one run's input is admitted."""

    restricted: bool = False
    """A group or stranger session: a blank display name is a neutral third party."""
    trusted: bool = False
    """The application's own input (`Trusted`): system and assistant text allowed."""
    max_image_bytes: int = MAX_IMAGE_BYTES
    """Larger images become a placeholder before anything is stored."""
    mentioned: bool = False
    """The platform flagged the input as a mention (`SessionEnv.mentioned`): each human
    message carries the flag (`MENTIONED`), so a merged burst keeps it per message."""
    unnamed_is_owner: bool = True
    """A human message without a name is the owner's; when not (an `update_state` edit of a
    thread that is not the owner's), a neutral third party's."""
    now: datetime | None = None
    """When the run arrived: each admitted human message is dated with it (`SAID_AT`),
    unless it is the application's and brings a date of its own (as an assistant message
    of the application's may; one that does not is said in its turn)."""


def admit_messages(raw: Any, rules: Rules, *, opening: bool = True) -> list[BaseMessage]:
    """The turn's messages, normalised; when they open a turn, at least one of them human.

    Like `add_messages`, a list holds several messages and anything else is one.
    """
    items = raw if isinstance(raw, list) else [] if raw is None else [raw]
    if not items:
        raise ValueError("turn input: 'messages' must hold at least one message")
    messages = [admit_message(item, f"messages[{i}]", rules) for i, item in enumerate(items)]
    if opening and not any(isinstance(m, HumanMessage) for m in messages):
        raise ValueError("turn input: a turn needs at least one human message")
    check_calls_answered(messages)
    return messages


def _as_message(item: Any, where: str) -> BaseMessage:
    """A message object from what LangChain would coerce into one, or a clear error."""
    if isinstance(item, BaseMessage):
        return item
    if not isinstance(item, (str, dict, tuple, list)):
        raise TypeError(f"{where}: expected a message, got {type(item).__name__}")
    try:
        return convert_to_messages([item])[0]
    except (ValueError, TypeError, NotImplementedError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{where}: not a message ({reason})") from exc


def admit_message(item: Any, where: str, rules: Rules) -> BaseMessage:
    """One message rebuilt from its content, name and id (and its calls), or a clear error."""
    message = _as_message(item, where)
    message_id = _message_id(message.id, where)
    if isinstance(message, HumanMessage):
        content = admit_content(message.content, where, max_image_bytes=rules.max_image_bytes)
        name = _third_party_name(message.name, rules.restricted)
        if name is None and not rules.unnamed_is_owner:
            name = UNNAMED_MEMBER
        stamps: dict[str, object] = {MENTIONED: True} if rules.mentioned else {}
        if rules.restricted:
            stamps[RESTRICTED] = True  # said in a group or stranger session: never extracted
        stamps.update(date_stamp(message, where, rules))
        metadata = annotation_metadata(**stamps)
        return HumanMessage(content, name=name, id=message_id, response_metadata=metadata)
    if rules.trusted and isinstance(message, SystemMessage):
        text = admit_content(message.content, where, max_image_bytes=None)
        return SystemMessage(text, id=message_id)
    if rules.trusted and isinstance(message, AIMessage):
        reply = admit_reply(message, where, message_id)
        stamp = date_stamp(message, where, replace(rules, now=None))  # undated: its turn's
        return annotated(reply, **stamp) if stamp else reply
    if rules.trusted and isinstance(message, ToolMessage):
        return admit_tool_result(message, where, message_id)
    allowed = (
        "human, system, assistant or tool messages"
        if rules.trusted
        else "human messages (wrap the input in Trusted(...) for system or assistant text)"
    )
    kind = type(message).__name__
    raise ValueError(f"{where}: a {kind} cannot be turn input; a turn takes {allowed}")


def date_stamp(message: BaseMessage, where: str, rules: Rules) -> dict[str, str]:
    """The `SAID_AT` annotation of an admitted message: the date a trusted message brings
    (`nodes.kernel.transcript.dated`), else the run's arrival ({} without a clock)."""
    given = annotations_of(message).get(SAID_AT) if rules.trusted else None
    if given is not None:
        if said_at(message) is None:
            raise ValueError(f"{where}: {SAID_AT} {given!r} is not an ISO 8601 date")
        return {SAID_AT: given}
    return {SAID_AT: rules.now.isoformat()} if rules.now is not None else {}


def admit_reply(message: AIMessage, where: str, message_id: str | None) -> AIMessage:
    """An assistant message of the application's: text, and calls every provider takes
    (each must be answered by a tool message that follows: `check_calls_answered`)."""
    if message.invalid_tool_calls:
        raise ValueError(f"{where}: an assistant message with unparseable tool calls")
    calls = [
        admit_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(message.tool_calls)
    ]
    content = (
        admit_content(message.content, where, max_image_bytes=None)
        if not calls or not is_blank(message_text(message))
        else ""
    )
    name = single_line(message.name or "") or None
    return AIMessage(content, name=name, id=message_id, tool_calls=calls)


def admit_call(call: ToolCall, where: str) -> ToolCall:
    """A tool call with an id and a name every provider takes, and arguments as a dict."""
    if not usable_call_id(call.get("id")):
        raise ValueError(f"{where}: call id {call.get('id')!r} is not [A-Za-z0-9_-]{{1,40}}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: a tool call needs a name")
    return ToolCall(name=name, args=dict(call.get("args") or {}), id=call["id"], type="tool_call")


def admit_tool_result(message: ToolMessage, where: str, message_id: str | None) -> ToolMessage:
    """A tool result of the application's, answering a call before it (see
    `check_calls_answered`)."""
    if not usable_call_id(message.tool_call_id):
        raise ValueError(f"{where}: tool_call_id {message.tool_call_id!r} is not a usable call id")
    text = message_text(message)
    return ToolMessage(
        clean_text(text) or "(empty)",
        tool_call_id=message.tool_call_id,
        name=single_line(message.name or "") or None,
        status=message.status,
        id=message_id,
    )


def check_calls_answered(messages: Sequence[BaseMessage]) -> None:
    """Every call is answered by a tool message before the next human, assistant or system
    message, and every tool message answers a call of the reply before it: a provider
    refuses a transcript with an unanswered call or a result without one."""
    open_calls: dict[str, str] = {}
    seen: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if isinstance(message, ToolMessage):
            if open_calls.pop(message.tool_call_id, None) is None:
                raise ValueError(
                    f"{where}: tool result for {message.tool_call_id!r} answers no call before it"
                )
            continue
        if open_calls:
            call_id, call_at = next(iter(open_calls.items()))
            raise ValueError(f"{call_at}: tool call {call_id!r} has no result before {where}")
        if isinstance(message, AIMessage):
            for call_id in (str(call["id"]) for call in message.tool_calls):
                if call_id in seen:
                    raise ValueError(f"{where}: tool call id {call_id!r} is used twice")
                seen.add(call_id)
                open_calls[call_id] = where
    if open_calls:
        call_id, call_at = next(iter(open_calls.items()))
        raise ValueError(f"{call_at}: tool call {call_id!r} has no result")


def _message_id(value: str | None, where: str) -> str | None:
    if value is not None:
        check_id(f"{where}.id", value)
    return value


def _third_party_name(name: str | None, restricted: bool) -> str | None:
    """The normalised display name; blank ones are a neutral third party in restricted sessions."""
    if name is None:
        return None
    return display_name(name) or (UNNAMED_MEMBER if restricted else None)


def admit_content(
    content: Any, where: str, *, max_image_bytes: int | None
) -> str | list[str | dict[str, Any]]:
    """Non-empty text, or known content blocks (images only where `max_image_bytes` is set:
    up to that size, larger ones become a placeholder)."""
    if isinstance(content, str):
        text = clean_text(content)
        if is_blank(text):
            raise ValueError(
                f"{where}: the message has no text (only whitespace or invisible characters)"
            )
        return text
    if not isinstance(content, list):
        raise TypeError(f"{where}: content must be text or a list of blocks")
    blocks: list[str | dict[str, Any]] = [
        block
        for j, raw in enumerate(content)
        if (block := admit_block(raw, f"{where}.content[{j}]", max_image_bytes)) is not None
    ]
    if not blocks:
        raise ValueError(f"{where}: the message has no text or image")
    return blocks


def admit_block(raw: Any, where: str, max_image_bytes: int | None) -> dict[str, str] | None:
    """A text block, a normalised image block, or None for a blank text block."""
    block = {"type": "text", "text": raw} if isinstance(raw, str) else raw
    if not isinstance(block, dict):
        raise TypeError(f"{where}: expected a content block, got {type(raw).__name__}")
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}: a text block needs its 'text' as a string")
        text = clean_text(text)
        return None if is_blank(text) else {"type": "text", "text": text}
    if max_image_bytes is not None and kind in IMAGE_BLOCK_TYPES:
        return normalise_image(block, max_image_bytes)
    known = "text, image, image_url" if max_image_bytes is not None else "text"
    raise ValueError(f"{where}: unknown content block type {kind!r} (known: {known})")
