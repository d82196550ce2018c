"""The inbox behind the session lock: who holds a session's turn, and who waits for it.

Every call on a session enters the inbox as an `Entry` (its messages, already
carrying ids). The rules are the same for every backend:

- one holder per session (thread id) at a time;
- the next turn belongs to the oldest waiting entry whose caller is alive;
  under `merge` that turn also takes every other waiting entry of the same
  group (same context, same extra input), which its caller then reads as
  `Answered`;
- an entry a turn took but did not answer (the turn failed, or the process
  running it died) goes back to its own caller, which recovers it: see
  `Claim.recovering`;
- an entry whose caller is gone (it left, or its process died) is dropped,
  never stored.

`ProcessInbox` keeps all of this in the process; `graph.sessions.sql` keeps it
in the checkpoint database, so processes sharing a saver share the inbox.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property, partial

from langchain_core.messages import BaseMessage

from nodes.kernel.lease import LIFE

WAITING, TAKEN, DONE, LEFT = "waiting", "taken", "done", "left"
"""Entry states: waiting for a turn; in a turn; answered by a turn; its caller left mid-turn."""

_TICKETS = itertools.count()


def new_ticket() -> str:
    """A ticket no other call of any process shares (a uuid4 per call costs ~8 µs here).

    It starts with this process's life token (`nodes.kernel.lease.LIFE`): a row's
    holder is told from an earlier process that had the same pid by it."""
    return f"{LIFE}-{os.getpid()}-{next(_TICKETS)}"


class PlaceLost(RuntimeError):
    """A waiting call's entry is gone: its process stopped renewing it for longer than its lease."""


@dataclass(eq=False)
class Entry:
    """One call on a session: the messages it brings (none for a resume)."""

    thread_id: str
    messages: list[BaseMessage]
    grouping: str | Callable[[], str | None] | None
    """The group, or how to work it out: only a call that has to wait needs it."""
    ticket: str = field(default_factory=lambda: new_ticket())

    @cached_property
    def group(self) -> str | None:
        """Calls with equal groups may share a turn under `merge`; `None` always runs alone."""
        return self.grouping() if callable(self.grouping) else self.grouping


@dataclass
class Claim:
    """A session's turn, held by the caller of `entry` until `SessionInbox.release`."""

    entry: Entry
    merged: list[Entry] = field(default_factory=list)
    """Other callers' entries this turn answers too, in arrival order."""
    recovering: bool = False
    """`entry` was taken by a turn that never answered it: it may or may not be stored."""


@dataclass(frozen=True)
class Answered:
    """Another caller's turn answered this entry; its state is at `checkpoint_id`."""

    checkpoint_id: str


@dataclass(frozen=True)
class Row:
    """What the turn rule needs to know about one entry, in arrival order."""

    ticket: str
    group: str | None
    status: str
    live: bool = True


def next_turn(rows: Sequence[Row], ticket: str, merge: bool) -> list[str] | None:
    """The tickets the session's next turn takes, `ticket` first, when `ticket` may
    take the (free) session now; `None` when it is another caller's turn."""
    mine = next((r for r in rows if r.ticket == ticket), None)
    if mine is None:
        return None
    if mine.status == TAKEN:
        return [ticket]  # its turn never answered it: its own caller recovers it
    waiting = [r for r in rows if r.status == WAITING and r.live]
    if not waiting or waiting[0].ticket != ticket:
        return None
    if not merge or mine.group is None:
        return [ticket]
    return [ticket, *(r.ticket for r in waiting[1:] if r.group == mine.group)]


class Ring:
    """One waiter's doorbell: a thread blocks on it, a coroutine awaits it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._wake: Callable[[], object] | None = None

    def __call__(self) -> None:
        self._event.set()
        if self._wake is not None:
            self._wake()

    def wait(self, seconds: float) -> None:
        self._event.wait(seconds)

    async def wait_async(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        rung = loop.create_future()
        self._wake = partial(loop.call_soon_threadsafe, _settle, rung)
        if self._event.is_set():
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(rung, seconds)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Doorbell:
    """Wakes this process's waiters on a session the moment its turn ends here;
    changes made by other processes are seen on the next poll."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._rings: dict[str, set[Ring]] = {}

    def arm(self, key: str) -> Ring:
        ring = Ring()
        with self._mutex:
            self._rings.setdefault(key, set()).add(ring)
        return ring

    def disarm(self, key: str, ring: Ring) -> None:
        with self._mutex:
            rings = self._rings.get(key)
            if rings is not None:
                rings.discard(ring)
                if not rings:
                    del self._rings[key]

    def ring(self, key: str) -> None:
        with self._mutex:
            rings = self._rings.pop(key, set())
        for ring in rings:
            ring()


class SessionInbox(ABC):
    """The operations the session gate needs; see the module docstring for the rules."""

    blocking = False
    """Whether operations wait on a database (async callers then run them on a thread)."""
    poll_every = 1.0
    """Seconds between a waiter's checks; only other processes' changes need them."""

    def __init__(self) -> None:
        self.bell = Doorbell()

    @abstractmethod
    def enter(self, entry: Entry, *, merge: bool, queue: bool) -> Claim | None:
        """Claim the session for `entry` if it is free and nobody waits; otherwise
        queue the entry (or, with `queue=False`, leave no trace) and return None."""

    @abstractmethod
    def poll(self, entry: Entry, *, merge: bool) -> Claim | Answered | None:
        """The entry's turn, its answer, or None: keep waiting."""

    @abstractmethod
    def withdraw(self, entry: Entry) -> bool:
        """Drop a waiting entry; False when a turn has already taken it."""

    @abstractmethod
    def leave(self, entry: Entry) -> None:
        """Its caller stopped waiting: drop the entry and any answer nobody will read."""

    @abstractmethod
    def release(self, claim: Claim, checkpoint_id: str | None) -> None:
        """End the turn. With the final checkpoint's id the merged entries are
        answered; with None (the turn did not finish) their callers recover them."""

    @abstractmethod
    def queued(self, thread_id: str) -> int:
        """How many calls wait for the session's next turn."""


class ProcessInbox(SessionInbox):
    """The inbox of one process: for the in-memory saver and savers without a URL."""

    def __init__(self) -> None:
        super().__init__()
        self._mutex = threading.Lock()
        self._holders: set[str] = set()
        self._lines: dict[str, dict[str, tuple[Entry, str]]] = {}
        """thread id → ticket → (entry, status), in arrival order."""
        self._answers: dict[str, str] = {}

    def enter(self, entry: Entry, *, merge: bool, queue: bool) -> Claim | None:
        with self._mutex:
            line = self._lines.setdefault(entry.thread_id, {})
            free = entry.thread_id not in self._holders and all(
                status != WAITING for _, status in line.values()
            )
            if free:
                return self._take(entry, [entry.ticket])
            if queue:
                line[entry.ticket] = (entry, WAITING)
            elif not line:
                del self._lines[entry.thread_id]
            return None

    def poll(self, entry: Entry, *, merge: bool) -> Claim | Answered | None:
        with self._mutex:
            if (checkpoint_id := self._answers.pop(entry.ticket, None)) is not None:
                return Answered(checkpoint_id)
            line = self._lines[entry.thread_id]
            if entry.thread_id in self._holders or entry.ticket not in line:
                return None
            rows = [Row(t, e.group, status) for t, (e, status) in line.items()]
            tickets = next_turn(rows, entry.ticket, merge)
            return None if tickets is None else self._take(entry, tickets)

    def _take(self, entry: Entry, tickets: list[str]) -> Claim:
        line = self._lines[entry.thread_id]
        recovering = line.get(entry.ticket, (entry, WAITING))[1] == TAKEN
        for ticket in [t for t, (_, status) in line.items() if status == LEFT]:
            del line[ticket]  # left a turn that is over
        line[entry.ticket] = (entry, TAKEN)
        merged = [line[t][0] for t in tickets[1:]]
        for other in merged:
            line[other.ticket] = (other, TAKEN)
        self._holders.add(entry.thread_id)
        return Claim(entry, merged, recovering)

    def withdraw(self, entry: Entry) -> bool:
        with self._mutex:
            line = self._lines.get(entry.thread_id, {})
            if entry.ticket not in line or line[entry.ticket][1] != WAITING:
                return False
            del line[entry.ticket]
        self.bell.ring(entry.thread_id)
        return True

    def leave(self, entry: Entry) -> None:
        with self._mutex:
            self._answers.pop(entry.ticket, None)
            line = self._lines.get(entry.thread_id, {})
            if entry.ticket in line:
                if line[entry.ticket][1] == TAKEN and entry.thread_id in self._holders:
                    line[entry.ticket] = (entry, LEFT)
                else:
                    del line[entry.ticket]
        self.bell.ring(entry.thread_id)

    def release(self, claim: Claim, checkpoint_id: str | None) -> None:
        thread = claim.entry.thread_id
        with self._mutex:
            line = self._lines[thread]
            line.pop(claim.entry.ticket, None)
            if checkpoint_id is not None:
                for other in claim.merged:
                    if line.pop(other.ticket, (other, LEFT))[1] == TAKEN:
                        self._answers[other.ticket] = checkpoint_id
            self._holders.discard(thread)
            if not line:
                del self._lines[thread]
        self.bell.ring(thread)

    def queued(self, thread_id: str) -> int:
        with self._mutex:
            line = self._lines.get(thread_id, {})
            return sum(status == WAITING for _, status in line.values())
