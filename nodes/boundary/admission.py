"""The boundary: what a run may bring in, checked once, before any node runs.

Everything past this point trusts its input. A run that brings something no
provider could render, or that would poison the session for later turns, is
refused here with a `ValueError`/`TypeError` that names the problem — and
nothing of it is stored. What is admitted is normalised:

- **Turn input** is a dict with `messages` and optionally `working_memory`
  (text). Messages are human messages — `HumanMessage`, or anything LangChain
  turns into one: `"text"`, `("user", …)`, `{"role": "user", …}`,
  `{"type": "human", …}` — with non-empty text or content blocks of known
  types (`text`, `image`, `image_url`). Each is rebuilt from its content, name
  and id alone, so a caller can't slip in the loop's own annotations. A
  platform's mention (`SessionEnv(mentioned=True)`) is stamped on each of them,
  and so is a group or stranger session (no memory extraction reads those).
- **Images** become the one block shape every provider renders, or a text
  placeholder (`nodes.kernel.images`).
- **Display names** are normalised (`nodes.kernel.sanitize.display_name`). In a group
  or stranger session, `name=None` marks the owner; any other name is a third
  party, and one with nothing visible left becomes `未命名成员` — never the owner.
- **Text** has lone surrogates replaced with U+FFFD; **ids** (thread, session,
  turn, message) with a NUL or a lone surrogate are refused.
- **Context** is a `SessionEnv`, a dict that validates as one, or None (the owner).

System and assistant text come only from the application: wrap the input in
`Trusted(...)` (see there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command
from pydantic import ValidationError

from nodes.core.env import SessionEnv
from nodes.core.state import TurnInput
from nodes.kernel.compat import inside_parent_run
from nodes.kernel.images import IMAGE_BLOCK_TYPES, MAX_IMAGE_BYTES, normalise_image
from nodes.kernel.messages import message_text
from nodes.kernel.replies import usable_call_id
from nodes.kernel.run_config import configurable
from nodes.kernel.sanitize import UNNAMED_MEMBER, check_id, display_name
from nodes.kernel.text import clean_text, is_blank, single_line
from nodes.kernel.transcript import RESTRICTED, annotated
from nodes.presence.mentions import MENTIONED

TURN_KEYS = TurnInput.__required_keys__ | TurnInput.__optional_keys__
_CONTEXT_IDS = ("persona_id", "session_id", "turn_id")


@dataclass(frozen=True)
class Trusted:
    """Turn input from the application itself rather than from a chat participant.

    Besides human messages it may carry `SystemMessage`s (stored in the
    transcript and shown to the model in place) and `AIMessage`s without tool
    calls (say, a reply the persona gave on another channel; set `name` to the
    persona id). It still needs a human message to open the turn, and is
    otherwise checked and normalised like any turn input. It may also wrap a
    `Command` (its update then follows these rules, and it may `goto`), or the
    values of `graph.update_state`. Never wrap text that a chat participant
    controls.

    Example:
        graph.invoke(
            Trusted({"messages": [SystemMessage("主人今天过生日"), HumanMessage("早")]}),
            {"configurable": {"thread_id": "s1"}},
        )
    """

    input: Mapping[str, Any] | Command


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


def admit(
    input: Any,
    config: RunnableConfig | None,
    context: Any,
    *,
    max_image_bytes: int = MAX_IMAGE_BYTES,
) -> tuple[Any, SessionEnv | None]:
    """The run's input and context as the loop may take them, or an exception.

    `None` resumes an interrupted turn; a `Command` resumes one too, and its
    `update` is checked like turn input (`Trusted(Command(...))` for the
    application's own); anything else starts a new turn.

    Raises:
        ValueError: input, context or thread id that the loop refuses, named.
        TypeError: a value of the wrong type (a context that is not a SessionEnv, say).
    """
    env = admit_context(context)
    check_thread(config)
    rules = Rules(
        restricted=env is not None and env.restricted,
        trusted=isinstance(input, Trusted),
        max_image_bytes=max_image_bytes,
        mentioned=env is not None and env.mentioned,
    )
    raw = input.input if isinstance(input, Trusted) else input
    if raw is None:
        return None, env
    if isinstance(raw, Command):
        return admit_command(raw, rules), env
    return admit_fields(raw, rules), env


def admit_command(command: Command, rules: Rules) -> Command:
    """A `Command` whose update follows the turn-input rules, and which only the
    application may use to steer the graph (`goto`, a parent graph)."""
    if not rules.trusted and (command.goto or command.graph is not None):
        raise ValueError(
            "Command(goto=…) and Command(graph=…) steer the loop itself: only the application "
            "may send them, as Trusted(Command(…))"
        )
    if command.update is None:
        return command
    return replace(command, update=admit_fields(command.update, rules, opening=False))


TRUSTED_STATE_KEYS = frozenset({"summary", "mood", "capacity", "image_descriptions"})
"""State a developer may set with `update_state`, wrapped in `Trusted`: the loop's own
bookkeeping, checked for shape. `pending_extractions`, `extracted_turn` and `model_view` are
never set."""


def admit_state_update(values: Any, *, owner_thread: bool = False) -> Any:
    """`graph.update_state` values, checked as turn input is, so nothing it accepts can
    break a later turn.

    Plain values may carry `messages` (human ones, as from a chat participant:
    Studio's state editor and a deployed server's state endpoint face the
    outside) and `working_memory`; a human message without a name is the owner's only
    on a thread opened as the owner's (`owner_thread`), else a neutral third party's.
    `Trusted({...})` may also carry system and assistant messages and
    `TRUSTED_STATE_KEYS`. `None` (a fork or a copy of a checkpoint) passes as it is.

    Raises:
        ValueError: a key or value the loop refuses, named.
        TypeError: values that are not a mapping.
    """
    trusted = isinstance(values, Trusted)
    raw = values.input if isinstance(values, Trusted) else values
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TypeError(f"update_state: values must be a dict, got {type(raw).__name__}")
    allowed = TURN_KEYS | (TRUSTED_STATE_KEYS if trusted else frozenset())
    if unknown := sorted(str(key) for key in raw if key not in allowed):
        hint = (
            f"; {sorted(TRUSTED_STATE_KEYS)} need Trusted({{...}})"
            if set(unknown) & TRUSTED_STATE_KEYS
            else ""
        )
        raise ValueError(f"update_state: unknown or refused key(s) {unknown}{hint}")
    rules = Rules(restricted=True, trusted=trusted, unnamed_is_owner=owner_thread or trusted)
    admitted = admit_fields({k: raw[k] for k in TURN_KEYS if k in raw}, rules, opening=False)
    admitted.update(admit_bookkeeping({k: raw[k] for k in TRUSTED_STATE_KEYS if k in raw}))
    return admitted


def admit_bookkeeping(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The loop's own state keys, each of the shape the nodes read."""
    admitted = dict(fields)
    if "summary" in fields:
        summary = fields["summary"]
        if not (
            isinstance(summary, Mapping)
            and isinstance(summary.get("text"), str)
            and isinstance(summary.get("upto"), str)
        ):
            raise ValueError("update_state: summary must be {'text': str, 'upto': message id}")
        admitted["summary"] = {"text": clean_text(summary["text"]), "upto": summary["upto"]}
    for key, kind in (("capacity", int), ("image_descriptions", str)):
        value = fields.get(key)
        if key in fields and not (
            isinstance(value, Mapping)
            and all(isinstance(k, str) and isinstance(v, kind) for k, v in value.items())
        ):
            raise ValueError(f"update_state: {key} must map text to {kind.__name__}")
    return admitted


def admit_context(context: Any) -> SessionEnv | None:
    """The run's SessionEnv (None: the owner's defaults); anything else is refused."""
    if context is None:
        return None
    if isinstance(context, Mapping):
        try:
            context = SessionEnv.model_validate(dict(context))
        except ValidationError as exc:
            raise ValueError(f"context: not a valid SessionEnv: {exc}") from exc
    if not isinstance(context, SessionEnv):
        raise TypeError(
            f"context must be a SessionEnv or a dict of its fields, got {type(context).__name__}"
        )
    for field in _CONTEXT_IDS:
        if (value := getattr(context, field)) is not None:
            check_id(f"context.{field}", value)
    return context


def check_thread(config: RunnableConfig | None) -> None:
    """Refuse a thread id the savers cannot store (they fail with raw database errors), and a
    checkpoint namespace of the caller's own: LangGraph gives one to a subgraph's run, and
    a session's lock, checkpoints and resume all live in the thread's root namespace."""
    given = configurable(config)
    if "thread_id" in given:
        check_id("thread id", given["thread_id"])
    if given.get("checkpoint_ns") and not inside_parent_run(config):
        raise ValueError(
            f"checkpoint_ns {given['checkpoint_ns']!r}: a session is its thread_id; the namespace "
            "is LangGraph's own, for subgraphs (a run under another namespace would take no lock "
            "and save nothing)"
        )


def admit_fields(fields: Any, rules: Rules, *, opening: bool = True) -> dict[str, Any]:
    """Turn input (or a Command's update) with every field checked and normalised."""
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"turn input must be a dict like {{'messages': [...]}}, got {type(fields).__name__}"
        )
    unknown = sorted(str(key) for key in fields if key not in TURN_KEYS)
    if unknown:
        raise ValueError(f"turn input: unknown key(s) {unknown}; a turn takes {sorted(TURN_KEYS)}")
    admitted: dict[str, Any] = {}
    if opening or "messages" in fields:
        admitted["messages"] = admit_messages(fields.get("messages"), rules, opening=opening)
    if fields.get("working_memory") is not None:
        admitted["working_memory"] = admit_working_memory(fields["working_memory"])
    return admitted


def admit_working_memory(value: Any) -> str:
    """Working memory is text: anything else would fail every later turn's view."""
    if not isinstance(value, str):
        raise TypeError(f"working_memory must be text, got {type(value).__name__}")
    return clean_text(value)


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
        human = HumanMessage(content, name=name, id=message_id)
        stamps = {MENTIONED: True} if rules.mentioned else {}
        if rules.restricted:
            stamps[RESTRICTED] = True  # said in a group or stranger session: never extracted
        return annotated(human, **stamps) if stamps else human
    if rules.trusted and isinstance(message, SystemMessage):
        text = admit_content(message.content, where, max_image_bytes=None)
        return SystemMessage(text, id=message_id)
    if rules.trusted and isinstance(message, AIMessage):
        return admit_reply(message, where, message_id)
    if rules.trusted and isinstance(message, ToolMessage):
        return admit_tool_result(message, where, message_id)
    allowed = (
        "human, system, assistant or tool messages"
        if rules.trusted
        else "human messages (wrap the input in Trusted(...) for system or assistant text)"
    )
    kind = type(message).__name__
    raise ValueError(f"{where}: a {kind} cannot be turn input; a turn takes {allowed}")


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
