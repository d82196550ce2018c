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
  and id alone, so a caller can't slip in the loop's own annotations.
- **Images** become the one block shape every provider renders, or a text
  placeholder (`nodes.view.images`).
- **Display names** are normalised (`nodes.view.sanitize.display_name`). In a group
  or stranger session, `name=None` marks the owner; any other name is a third
  party, and one with nothing visible left becomes `未命名成员` — never the owner.
- **Text** has lone surrogates replaced with U+FFFD; **ids** (thread, session,
  turn, message) with a NUL or a lone surrogate are refused.
- **Context** is a `SessionEnv`, a dict that validates as one, or None (the owner).

System and assistant text come only from the application: wrap the input in
`Trusted(...)` (see there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    convert_to_messages,
)
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command
from pydantic import ValidationError

from memory.text import clean_text, is_blank, single_line
from nodes.env import SessionEnv
from nodes.run_config import configurable
from nodes.state import TurnInput
from nodes.view.images import IMAGE_BLOCK_TYPES, normalise_image
from nodes.view.sanitize import UNNAMED_MEMBER, check_id, display_name

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


def admit(input: Any, config: RunnableConfig | None, context: Any) -> tuple[Any, SessionEnv | None]:
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
    restricted = env is not None and env.restricted
    trusted = isinstance(input, Trusted)
    raw = input.input if isinstance(input, Trusted) else input
    if raw is None:
        return None, env
    if isinstance(raw, Command):
        return admit_command(raw, restricted, trusted=trusted), env
    return admit_fields(raw, restricted, trusted=trusted), env


def admit_command(command: Command, restricted: bool, *, trusted: bool) -> Command:
    """A `Command` whose update follows the turn-input rules, and which only the
    application may use to steer the graph (`goto`, a parent graph)."""
    if not trusted and (command.goto or command.graph is not None):
        raise ValueError(
            "Command(goto=…) and Command(graph=…) steer the loop itself: only the application "
            "may send them, as Trusted(Command(…))"
        )
    if command.update is None:
        return command
    update = admit_fields(command.update, restricted, trusted=trusted, opening=False)
    return replace(command, update=update)


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
    """Refuse a thread id the savers cannot store (they fail with raw database errors)."""
    if "thread_id" in (given := configurable(config)):
        check_id("thread id", given["thread_id"])


def admit_fields(
    fields: Any, restricted: bool, *, trusted: bool, opening: bool = True
) -> dict[str, Any]:
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
        admitted["messages"] = admit_messages(
            fields.get("messages"), restricted, trusted=trusted, opening=opening
        )
    if fields.get("working_memory") is not None:
        admitted["working_memory"] = admit_working_memory(fields["working_memory"])
    return admitted


def admit_working_memory(value: Any) -> str:
    """Working memory is text: anything else would fail every later turn's view."""
    if not isinstance(value, str):
        raise TypeError(f"working_memory must be text, got {type(value).__name__}")
    return clean_text(value)


def admit_messages(
    raw: Any, restricted: bool, *, trusted: bool, opening: bool = True
) -> list[BaseMessage]:
    """The turn's messages, normalised; when they open a turn, at least one of them human.

    Like `add_messages`, a list holds several messages and anything else is one.
    """
    items = raw if isinstance(raw, list) else [] if raw is None else [raw]
    if not items:
        raise ValueError("turn input: 'messages' must hold at least one message")
    messages = [
        admit_message(item, f"messages[{i}]", restricted, trusted=trusted)
        for i, item in enumerate(items)
    ]
    if opening and not any(isinstance(m, HumanMessage) for m in messages):
        raise ValueError("turn input: a turn needs at least one human message")
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


def admit_message(item: Any, where: str, restricted: bool, *, trusted: bool) -> BaseMessage:
    """One message rebuilt from its content, name and id, or a clear error."""
    message = _as_message(item, where)
    message_id = _message_id(message.id, where)
    if isinstance(message, HumanMessage):
        content = admit_content(message.content, where, images=True)
        name = _third_party_name(message.name, restricted)
        return HumanMessage(content, name=name, id=message_id)
    if trusted and isinstance(message, SystemMessage):
        return SystemMessage(admit_content(message.content, where, images=False), id=message_id)
    if trusted and isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            raise ValueError(
                f"{where}: an assistant message with tool calls needs their results, "
                "which only the loop makes"
            )
        content = admit_content(message.content, where, images=False)
        return AIMessage(content, name=single_line(message.name or "") or None, id=message_id)
    allowed = (
        "human, system or assistant messages"
        if trusted
        else "human messages (wrap the input in Trusted(...) for system or assistant text)"
    )
    kind = type(message).__name__
    raise ValueError(f"{where}: a {kind} cannot be turn input; a turn takes {allowed}")


def _message_id(value: str | None, where: str) -> str | None:
    if value is not None:
        check_id(f"{where}.id", value)
    return value


def _third_party_name(name: str | None, restricted: bool) -> str | None:
    """The normalised display name; blank ones are a neutral third party in restricted sessions."""
    if name is None:
        return None
    return display_name(name) or (UNNAMED_MEMBER if restricted else None)


def admit_content(content: Any, where: str, *, images: bool) -> str | list[str | dict[str, Any]]:
    """Non-empty text, or known content blocks (images only where `images`)."""
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
        if (block := admit_block(raw, f"{where}.content[{j}]", images=images)) is not None
    ]
    if not blocks:
        raise ValueError(f"{where}: the message has no text or image")
    return blocks


def admit_block(raw: Any, where: str, *, images: bool) -> dict[str, str] | None:
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
    if images and kind in IMAGE_BLOCK_TYPES:
        return normalise_image(block)
    known = "text, image, image_url" if images else "text"
    raise ValueError(f"{where}: unknown content block type {kind!r} (known: {known})")
