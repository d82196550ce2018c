"""A session is what it was opened as: the env every run on a thread runs under.

A thread's actor is written once, with its first turn (`opened_as`); each turn's
env is recorded on its first message (`nodes.extraction.node.TURN_OPENED`). Every run
(a new message, `invoke(None)`, a `Command`, another process's, Studio's) is
bound to them before anything runs (`nodes.core.env.bound_env`): a resume of a group
turn is that group's whatever context it brings, and a context that names
another actor is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from nodes.core.env import SessionEnv, SessionMismatchError
from nodes.core.state import OPENED_AS
from nodes.kernel.messages import last_human
from nodes.kernel.run_config import thread_id
from nodes.kernel.transcript import said_in_restricted


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
    """This run writes what the thread was opened as: a new thread, or one whose latest
    checkpoint lacks the record (a branch forked before it was written)."""


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
    """The actor a saved checkpoint says its thread was opened as (`opened_as`), read
    without loading its transcript; None when it says none."""
    opened = saved.checkpoint["channel_values"].get(OPENED_AS) if saved else None
    return opened["actor"] if opened else None


def _root(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


@dataclass(frozen=True)
class Opened:
    """What a thread was opened as, and whether its latest checkpoint records it."""

    actor: str | None
    """None: a new thread."""
    recorded: bool
    """False when only an older checkpoint does (a branch forked before the record)."""


def opened_as(saver: BaseCheckpointSaver, thread: str) -> Opened:
    """What `thread` was opened as: from its latest checkpoint (whatever checkpoint a run's
    config names: a fork must not make a thread new), else from any of its checkpoints."""
    latest = saver.get_tuple(_root(thread))
    if latest is None or opened_actor(latest) is not None:
        return Opened(opened_actor(latest), True)
    found = next(filter(None, map(opened_actor, saver.list(_root(thread)))), None)
    return Opened(found, False)


async def aopened_as(saver: BaseCheckpointSaver, thread: str) -> Opened:
    """`opened_as`, awaited."""
    latest = await saver.aget_tuple(_root(thread))
    if latest is None or opened_actor(latest) is not None:
        return Opened(opened_actor(latest), True)
    async for saved in saver.alist(_root(thread)):
        if (actor := opened_actor(saved)) is not None:
            return Opened(actor, False)
    return Opened(None, False)
