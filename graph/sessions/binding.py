"""A session is what it was opened as: the env every run on a thread runs under.

A thread's actor is written once, with its first turn (`opened_as`); each turn's
env is recorded on its first message (`nodes.extraction.TURN_OPENED`). Every run
(a new message, `invoke(None)`, a `Command`, another process's, Studio's) is
bound to them before anything runs (`nodes.env.bound_env`): a resume of a group
turn is that group's whatever context it brings, and a context that names
another actor is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from memory.transcript import last_human
from nodes.env import SessionEnv, SessionMismatchError
from nodes.run_config import thread_id
from nodes.state import OPENED_AS
from nodes.view.transcript import said_in_restricted


@dataclass(frozen=True)
class Asked:
    """A run as its caller asked for it: the raw input, as admitted, and the context."""

    raw: Any
    input: Any
    context: SessionEnv | None


@dataclass(frozen=True)
class Bound:
    """A run as it runs: under its thread's env, its input admitted under that env."""

    env: SessionEnv
    input: Any
    opens_thread: bool
    """The thread has no record of what it was opened as: this run's first turn writes it."""


def refuse_unrecorded_restricted(
    values: dict[str, Any], context: SessionEnv | None, config: RunnableConfig | None
) -> None:
    """A turn saved before turns recorded their env: one a group or stranger said is
    continued only by a run that says it is restricted (never as the owner's)."""
    human = last_human(values.get("messages", []))
    if human is not None and said_in_restricted(human) and not (context and context.restricted):
        raise SessionMismatchError(
            f"thread {thread_id(config)!r}: the interrupted turn was said in a group or "
            "stranger session; continue it with that SessionEnv(actor=...)"
        )


def opened_actor(saved: CheckpointTuple | None) -> str | None:
    """The actor a saved thread was opened as (`opened_as`), read from its latest checkpoint
    without loading its transcript; None for a thread no turn has opened."""
    opened = saved.checkpoint["channel_values"].get(OPENED_AS) if saved else None
    return opened["actor"] if opened else None
