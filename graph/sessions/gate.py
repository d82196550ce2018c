"""One turn at a time per session (thread id), and what a message arriving mid-turn gets.

`Sessions.busy_policy` decides:

- `merge` (default): the call waits; when the running turn ends, one turn
  answers every message that waited (with the same `SessionEnv` and extra
  input), each keeping its own speaker. The call that arrived first runs it
  and streams it; the others return that turn's final state.
- `enqueue`: the call waits for a turn of its own; turns run in arrival order.
- `reject`: `SessionBusyError` at once; nothing is stored.

A waiting call gives up after `busy_timeout` seconds with `SessionWaitTimeout`
(a `TimeoutError`); its message is then not stored. A message a turn has
already taken is never withdrawn: its caller waits for that turn instead.

The lock lives where the checkpoints live: savers from `open_checkpointer`
lock across processes (a lock row or a Postgres advisory lock, plus an inbox
table in the same database, so a turn in one process answers messages waiting
in another); any other saver (the in-memory one, or one the caller built)
locks within this process only.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from weakref import WeakValueDictionary

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.sessions.inbox import Answered, Claim, Entry, PlaceLost, ProcessInbox, SessionInbox
from graph.sessions.settings import BusyPolicy
from graph.storage.checkpoint import PerSaver, database_of
from nodes.core.env import SessionEnv
from nodes.kernel.run_config import configurable, thread_id
from nodes.kernel.steps import Either, Steps, Work

log = logging.getLogger("cyrene.sessions")


class SessionBusyError(RuntimeError):
    """The session is running a turn, and this call may not wait for it."""


class SessionWaitTimeout(SessionBusyError, TimeoutError):
    """A call waited `busy_timeout` seconds for its session; its message was not stored."""


class SessionReentryError(SessionBusyError):
    """A call on a session from inside that session's own running turn (a tool or hook that
    invokes the graph on its own thread): it would wait for the very turn it is part of."""


_HELD: ContextVar[frozenset[tuple[int, str]]] = ContextVar(
    "cyrene_held_sessions", default=frozenset()
)
"""The sessions (inbox, thread) whose turns run in this context: a tool of the turn, or a
caller still iterating its stream, sees its own session here."""


@contextmanager
def holding(inbox: SessionInbox, thread: str) -> Iterator[None]:
    """Mark `thread` as running its turn in this context (and in what it hands work to:
    LangGraph's task threads and tasks copy the context)."""
    token = _HELD.set(_HELD.get() | {(id(inbox), thread)})
    try:
        yield
    finally:
        with suppress(ValueError):  # a stream finalised from another context: nothing to undo
            _HELD.reset(token)


def refuse_reentry(inbox: SessionInbox, thread: str) -> None:
    """Raise at once for a call on a session from inside its own running turn."""
    if (id(inbox), thread) in _HELD.get():
        raise SessionReentryError(
            f"session {thread!r} is running the turn this call comes from (a tool or hook "
            "calling the graph on its own thread); it would wait for itself. Call it on "
            "another thread, or after the turn"
        )


# -- which inbox a saver's sessions use -------------------------------------------------

_BY_PLACE: WeakValueDictionary[str, SessionInbox] = WeakValueDictionary()


def _open_inbox(saver: BaseCheckpointSaver) -> SessionInbox:
    """A database inbox for savers `open_checkpointer` made; an in-process one otherwise."""
    kind, where = database_of(saver)
    if kind == "process":
        return ProcessInbox()
    place = f"sqlite:{where}" if kind == "sqlite" else where
    if (inbox := _BY_PLACE.get(place)) is None:
        inbox = _BY_PLACE[place] = _database_inbox(place, saver)
    return inbox


inbox_for = PerSaver(_open_inbox)
"""The inbox of the database a saver writes to; one per database and process."""


def _database_inbox(place: str, saver: BaseCheckpointSaver) -> SessionInbox:
    from graph.sessions.databases import PostgresInbox, SqliteInbox

    if place.startswith("sqlite:"):
        return SqliteInbox(Path(place.removeprefix("sqlite:")), saver.serde)
    return PostgresInbox(place, saver.serde)


def queued(graph: Any, thread_id: str) -> int:
    """How many calls wait for the session's next turn (0 for a graph without a saver)."""
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, BaseCheckpointSaver):
        return 0
    return inbox_for(saver).queued(thread_id)


# -- admission ------------------------------------------------------------------------------


def session_of(config: RunnableConfig | None) -> str | None:
    """The thread a run locks; None inside a parent graph's run or without a thread id."""
    if configurable(config).get("checkpoint_ns"):
        return None
    return thread_id(config)


def with_ids(input: Any) -> Any:
    """The input with an id on every message, so the call can tell when it is stored."""
    if not isinstance(input, dict) or not isinstance(input.get("messages"), list):
        return input
    messages = [
        m
        if not isinstance(m, BaseMessage) or m.id
        else m.model_copy(update={"id": str(uuid.uuid4())})
        for m in input["messages"]
    ]
    return {**input, "messages": messages}


def ids_given(input: Any) -> bool:
    """Whether every message of `input` came with an id (`with_ids` adds none): only such a
    call can re-send messages already stored, since an id `with_ids` makes is in no checkpoint."""
    if not isinstance(input, dict) or not isinstance(input.get("messages"), list):
        return True
    return all(not isinstance(m, BaseMessage) or m.id for m in input["messages"])


def group_of(input: Any, context: Any, config: RunnableConfig | None) -> str | None:
    """Calls that may share a turn: same context (but for the platform's mention), same
    extra input, same checkpoint."""
    if not isinstance(input, dict):
        return None  # a resume runs alone
    env = context if isinstance(context, SessionEnv) else SessionEnv()
    # A platform's mention is stamped on the call's own messages at the boundary, so
    # calls that differ only in it share a turn (a burst with one @-mention is one turn).
    facts = sorted((k, v) for k, v in vars(env).items() if k != "mentioned")
    extras = sorted((k, v) for k, v in input.items() if k != "messages")
    fork = configurable(config).get("checkpoint_id")
    # Compared across processes, so built of plain values' reprs (a pydantic repr is slow).
    return repr((facts, extras, fork))


def entry_for(thread_id: str, input: Any, context: Any, config: RunnableConfig | None) -> Entry:
    """The call's entry in the inbox; its group is worked out only if it has to wait."""
    messages = input.get("messages", []) if isinstance(input, dict) else []
    return Entry(
        thread_id,
        [m for m in messages if isinstance(m, BaseMessage)],
        lambda: group_of(input, context, config),
    )


def merged_input(claim: Claim, input: dict) -> dict:
    """The turn's input: the caller's messages, then every merged caller's, in arrival order."""
    if not claim.merged:
        return input
    return {
        **input,
        "messages": [*input["messages"], *(m for e in claim.merged for m in e.messages)],
    }


# -- waiting for the session ----------------------------------------------------------------


@dataclass
class SessionGate:
    """A call's way through one session's lock, under one policy, as steps of the call's run
    (`nodes.kernel.steps`): an inbox operation runs on a worker thread in an async run when
    the inbox's database blocks."""

    inbox: SessionInbox
    policy: BusyPolicy
    timeout: float

    def wait_turn(self, entry: Entry) -> Steps[Claim | Answered]:
        """Wait until the call holds the session, or another caller's turn answered it; a call
        that gives up (timed out, cancelled, failed) leaves no entry behind."""
        try:
            return (yield from self._wait(entry))
        except BaseException as exc:
            self._give_up(entry, exc)

    def _wait(self, entry: Entry) -> Steps[Claim | Answered]:
        """Enter the inbox, then poll it at each ring of the session's doorbell until the call
        is let in, answered by another caller's turn, or out of time."""
        merge, queue = self.policy == "merge", self.policy != "reject"
        enter = partial(self.inbox.enter, merge=merge, queue=queue)
        outcome = yield self._call(enter, entry)
        if outcome is None and not queue:
            raise SessionBusyError(
                f"session {entry.thread_id!r} is running a turn (busy_policy='reject'); "
                "nothing was stored, send again later"
            )
        deadline = time.monotonic() + self.timeout
        poll = partial(self.inbox.poll, merge=merge)
        while outcome is None:
            ring = self.inbox.bell.arm(entry.thread_id)
            try:
                outcome = yield self._call(poll, entry)
                left = deadline - time.monotonic()
                if outcome is None and left <= 0 and (yield self._call(self.inbox.withdraw, entry)):
                    raise SessionWaitTimeout(
                        f"session {entry.thread_id!r}: waited {self.timeout:g} s for the running "
                        "turn to end; the message was not stored"
                    )
                if outcome is None:  # the doorbell, at most until the next poll
                    pause = min(self.inbox.poll_every, max(left, 0.001))
                    yield Either(ring.wait, ring.wait_async, (pause,))
            finally:
                self.inbox.bell.disarm(entry.thread_id, ring)
        return outcome

    def _give_up(self, entry: Entry, exc: BaseException) -> NoReturn:
        if not isinstance(exc, SessionBusyError):
            try:
                self.inbox.leave(entry)
            except Exception:
                log.exception("session %r: could not drop a call that gave up", entry.thread_id)
        if isinstance(exc, PlaceLost):
            raise SessionWaitTimeout(f"{exc}; the message was not stored") from exc
        raise exc

    def release(self, claim: Claim, checkpoint_id: str | None) -> Work:
        """The step that gives the session back (`checkpoint_id`: what merged callers read)."""
        return self._call(self.inbox.release, claim, checkpoint_id)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Work:
        return Work(fn, args, self.inbox.blocking)


# -- what a call answered by another caller's turn yields -----------------------------------


def answered_chunks(values: Any, kwargs: dict[str, Any], default_mode: Any) -> list[Any]:
    """The final state, once, shaped as this run's `stream_mode` would have shaped it,
    when the run streams values; nothing otherwise (the turn's tokens and updates
    went to the caller that ran it)."""
    mode = kwargs.get("stream_mode") or default_mode
    modes = [mode] if isinstance(mode, str) else list(mode)
    if "values" not in modes:
        return []
    keys = kwargs.get("output_keys")
    if isinstance(keys, str):
        values = values.get(keys)
    elif keys is not None:
        values = {k: values[k] for k in keys if k in values}
    if kwargs.get("version") == "v2":
        return [{"type": "values", "ns": (), "data": values, "interrupts": ()}]
    subgraphs, many = kwargs.get("subgraphs"), not isinstance(mode, str)
    if subgraphs:
        return [((), "values", values) if many else ((), values)]
    return [("values", values) if many else values]
