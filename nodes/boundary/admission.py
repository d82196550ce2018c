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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command
from pydantic import ValidationError

from nodes.boundary.messages import Rules, admit_messages
from nodes.core.env import SessionEnv
from nodes.core.state import TurnInput
from nodes.kernel.compat import inside_parent_run
from nodes.kernel.images import MAX_IMAGE_BYTES
from nodes.kernel.run_config import configurable
from nodes.kernel.sanitize import check_id
from nodes.kernel.text import clean_text

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


def admit(
    input: Any,
    config: RunnableConfig | None,
    context: Any,
    *,
    max_image_bytes: int = MAX_IMAGE_BYTES,
    now: datetime | None = None,
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
        now=now,
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
