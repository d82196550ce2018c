"""The session inbox in the checkpoint database, shared by every process using it.

(`graph.sessions.databases` holds the SQLite and Postgres specifics.)

Two tables sit next to LangGraph's own: an inbox of calls waiting for (or in)
a session's turn, whose messages are stored with the saver's serializer so a
turn in one process can answer a message that waits in another; and, in
SQLite, one lock row per busy session. Postgres locks with
`pg_try_advisory_lock` on one connection per process instead, so the server
drops a dead process's locks by itself. No lock server of our own.

A SIGKILLed process must not block a session forever: each row names its
process (host, pid, and the life token its ticket starts with) and carries a
lease its process renews on a heartbeat thread. A row counts as dead when its
holder no longer holds the lease (`nodes.kernel.lease.holder_alive`: the lease ran
out, or its pid is gone or a zombie on this host, or it is an earlier life of
this process's pid).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from graph.sessions.inbox import (
    DONE,
    LEFT,
    TAKEN,
    WAITING,
    Answered,
    Claim,
    Entry,
    PlaceLost,
    Row,
    SessionInbox,
    next_turn,
)
from nodes.kernel.lease import Holder, holder_alive

log = logging.getLogger("cyrene.sessions")

LEASE = 20.0
"""Seconds a row stays alive without its process's heartbeat (renewed every LEASE / 4)."""
INBOX = "cyrene_session_inbox"
COLUMNS = "ticket, grp, status, host, pid, expires, checkpoint_id"


def holder_of(ticket: str, host: str, pid: int) -> Holder:
    """The process that wrote a row: its host and pid, and the life token its tickets start with."""
    return Holder(host, pid, ticket.partition("-")[0])


class SqlInbox(SessionInbox):
    """The shared logic; subclasses say how to connect and how a session is locked."""

    blocking = True
    poll_every = 0.02
    placeholder = "?"

    def __init__(self, serde: SerializerProtocol) -> None:
        super().__init__()
        self.serde = serde
        self.host = socket.gethostname()
        self._mutex = threading.Lock()
        self._held: set[str] = set()
        self._mine: set[str] = set()
        """Tickets of this process's rows: the heartbeat renews them."""
        self._conns: list[Any] = []
        self._conn: Any = None
        with self._mutex:
            self._setup()
        weakref.finalize(self, _close, self._conns)
        threading.Thread(
            target=_heartbeat, args=(weakref.ref(self),), name="cyrene-session-lease", daemon=True
        ).start()

    # -- what a backend provides ----------------------------------------------------------
    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _ddl(self) -> list[str]: ...

    @abstractmethod
    @contextmanager
    def _write(self, thread_id: str | None = None) -> Iterator[None]:
        """A transaction that excludes other writers of the session's rows."""

    @abstractmethod
    def _lock(self, thread_id: str, ticket: str) -> bool:
        """Take the session's cross-process lock (inside `_write`); False when held."""

    @abstractmethod
    def _quick_lock(self, thread_id: str, ticket: str) -> bool:
        """Take the lock in one statement if it is free and nobody waits; False sends
        the caller down the full path (which also clears what dead processes left)."""

    @abstractmethod
    def _unlock(self, thread_id: str, ticket: str, *, committed: bool) -> None:
        """Drop the lock: called inside the releasing transaction, then after it
        (also after a claim that failed half-way)."""

    def _renew_locks(self, expires: float) -> None:
        """Renew this process's lock leases (SQLite's lock rows; Postgres needs none)."""

    # -- plumbing -------------------------------------------------------------------------
    def _setup(self) -> None:
        self._conn = self._connect()
        self._conns.append(self._conn)
        with self._write():
            for statement in self._ddl():
                self._run(statement)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        cursor = self._conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []

    @staticmethod
    def _is_me(ticket: str, host: str, pid: int) -> bool:
        return holder_of(ticket, host, pid) == Holder.this_process()

    @staticmethod
    def _alive(ticket: str, host: str, pid: int, expires: float) -> bool:
        return holder_alive(holder_of(ticket, host, pid), expires)

    def _rows(self, thread_id: str) -> list[tuple]:
        return self._run(
            f"SELECT {COLUMNS} FROM {INBOX} WHERE thread_id = ? ORDER BY seq", (thread_id,)
        )

    def _live_rows(self, thread_id: str) -> list[tuple]:
        """The session's rows, after dropping those whose caller is gone."""
        rows: list[tuple] = []
        dead: list[tuple] = []
        for row in self._rows(thread_id):
            ticket, _, status, host, pid, expires, _ = row
            gone = status == LEFT and thread_id not in self._held
            (dead if gone or not self._alive(ticket, host, pid, expires) else rows).append(row)
        if dead:
            marks = ",".join("?" * len(dead))
            self._run(f"DELETE FROM {INBOX} WHERE ticket IN ({marks})", [r[0] for r in dead])
        return rows

    def _insert(self, entry: Entry, payload: tuple[str, bytes]) -> None:
        """A row for a waiting entry, with its group and its messages."""
        self._run(
            f"INSERT INTO {INBOX} (thread_id, ticket, grp, status, payload_type, payload,"
            " host, pid, expires) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.thread_id,
                entry.ticket,
                entry.group,
                WAITING,
                payload[0],
                payload[1],
                self.host,
                os.getpid(),
                time.time() + LEASE,
            ),
        )
        self._mine.add(entry.ticket)

    def _delete(self, ticket: str) -> None:
        self._run(f"DELETE FROM {INBOX} WHERE ticket = ?", (ticket,))
        self._mine.discard(ticket)

    # -- the inbox -----------------------------------------------------------------------
    def _acquire(self, thread_id: str, ticket: str) -> bool:
        if not self._lock(thread_id, ticket):
            return False
        self._held.add(thread_id)
        return True

    @contextmanager
    def _claiming(self, thread_id: str, ticket: str) -> Iterator[None]:
        """A write that may take the session's lock: if it fails after that, give it back."""
        held_before = thread_id in self._held
        try:
            with self._write(thread_id):
                yield
        except BaseException:
            if not held_before and thread_id in self._held:
                with suppress(Exception):
                    self._unlock(thread_id, ticket, committed=True)
                self._held.discard(thread_id)
            raise

    def enter(self, entry: Entry, *, merge: bool, queue: bool) -> Claim | None:
        thread = entry.thread_id
        with self._mutex:
            if thread not in self._held and self._quick_lock(thread, entry.ticket):
                self._held.add(thread)
                return Claim(entry)  # no row: nobody else ever reads a turn-holder's own entry
            return self._enter(entry, queue)

    def _enter(self, entry: Entry, queue: bool) -> Claim | None:
        thread = entry.thread_id
        with self._claiming(thread, entry.ticket):
            rows = self._live_rows(thread)
            if (
                thread not in self._held
                and all(r[2] != WAITING for r in rows)
                and self._acquire(thread, entry.ticket)
            ):
                return Claim(entry)  # no row: nobody else ever reads a turn-holder's own entry
            if queue:
                self._insert(entry, self.serde.dumps_typed(entry.messages))
            return None

    def poll(self, entry: Entry, *, merge: bool) -> Claim | Answered | None:
        thread = entry.thread_id
        with self._mutex:
            row = self._run(
                f"SELECT status, checkpoint_id FROM {INBOX} WHERE ticket = ?", (entry.ticket,)
            )
            if not row:
                raise PlaceLost(f"session {thread!r}: this call's place in the queue expired")
            if row[0][0] == DONE:
                self._delete(entry.ticket)
                return Answered(row[0][1])
            # A cheap look outside any write transaction first: most polls end here.
            if thread in self._held or not next_turn(
                self._as_rows(self._rows(thread)), entry.ticket, merge
            ):
                return None
            with self._claiming(thread, entry.ticket):
                rows = self._live_rows(thread)
                tickets = next_turn(self._as_rows(rows), entry.ticket, merge)
                if tickets is None or not self._acquire(thread, entry.ticket):
                    return None
                return self._take(entry, tickets, rows)

    def _as_rows(self, rows: list[tuple]) -> list[Row]:
        return [Row(r[0], r[1], r[2], self._alive(r[0], *r[3:6])) for r in rows]

    def _take(self, entry: Entry, tickets: list[str], rows: list[tuple]) -> Claim:
        recovering = next(r[2] for r in rows if r[0] == entry.ticket) == TAKEN
        marks = ",".join("?" * len(tickets))
        self._run(f"UPDATE {INBOX} SET status = ? WHERE ticket IN ({marks})", [TAKEN, *tickets])
        merged = []
        if len(tickets) > 1:
            stored = self._run(
                f"SELECT ticket, payload_type, payload FROM {INBOX} WHERE ticket IN ({marks})",
                tickets,
            )
            payloads = {t: (kind, bytes(data)) for t, kind, data in stored}
            merged = [
                Entry(entry.thread_id, self.serde.loads_typed(payloads[t]), entry.group, t)
                for t in tickets[1:]
            ]
        return Claim(entry, merged, recovering)

    def withdraw(self, entry: Entry) -> bool:
        with self._mutex, self._write(entry.thread_id):
            status = self._run(f"SELECT status FROM {INBOX} WHERE ticket = ?", (entry.ticket,))
            if not status or status[0][0] != WAITING:
                return False
            self._delete(entry.ticket)
        self.bell.ring(entry.thread_id)
        return True

    def leave(self, entry: Entry) -> None:
        with self._mutex, self._write(entry.thread_id):
            self._run(
                f"UPDATE {INBOX} SET status = ? WHERE ticket = ? AND status = ?",
                (LEFT, entry.ticket, TAKEN),
            )
            self._run(f"DELETE FROM {INBOX} WHERE ticket = ? AND status <> ?", (entry.ticket, LEFT))
            self._mine.discard(entry.ticket)
        self.bell.ring(entry.thread_id)

    def release(self, claim: Claim, checkpoint_id: str | None) -> None:
        thread, ticket = claim.entry.thread_id, claim.entry.ticket
        with self._mutex:
            try:
                if ticket in self._mine or claim.merged:
                    with self._write(thread):
                        self._settle(claim, checkpoint_id)
                        self._unlock(thread, ticket, committed=False)
                else:  # the common case: one statement, no transaction around it
                    self._unlock(thread, ticket, committed=False)
            finally:
                try:
                    self._unlock(thread, ticket, committed=True)
                except Exception:
                    log.exception("session %r: could not release its lock", thread)
                self._held.discard(thread)
        self.bell.ring(thread)

    def _settle(self, claim: Claim, checkpoint_id: str | None) -> None:
        """Drop the holder's row; answer the merged entries (or leave them to recover)."""
        if claim.entry.ticket in self._mine:
            self._delete(claim.entry.ticket)
        others = [e.ticket for e in claim.merged]
        if others and checkpoint_id is not None:
            marks = ",".join("?" * len(others))
            self._run(
                f"UPDATE {INBOX} SET status = ?, checkpoint_id = ?"
                f" WHERE status = ? AND ticket IN ({marks})",
                [DONE, checkpoint_id, TAKEN, *others],
            )
            self._run(
                f"DELETE FROM {INBOX} WHERE status = ? AND ticket IN ({marks})", [LEFT, *others]
            )

    def queued(self, thread_id: str) -> int:
        with self._mutex:
            rows = self._as_rows(self._rows(thread_id))
        return sum(r.status == WAITING and r.live for r in rows)

    def renew(self) -> None:
        """Extend this process's leases (the heartbeat calls this)."""
        with self._mutex:
            if not (self._mine or self._held):
                return
            expires = time.time() + LEASE
            with self._write():
                self._run(
                    f"UPDATE {INBOX} SET expires = ? WHERE host = ? AND pid = ?",
                    (expires, self.host, os.getpid()),
                )
                self._renew_locks(expires)


def _close(connections: list[Any]) -> None:
    """Close a dropped inbox's connections (Postgres releases its advisory locks)."""
    for conn in connections:
        with suppress(Exception):
            conn.close()


def _heartbeat(inbox_ref: weakref.ref[SqlInbox]) -> None:
    while True:
        time.sleep(LEASE / 4)
        inbox = inbox_ref()
        if inbox is None:
            return
        try:
            inbox.renew()
        except Exception:
            log.exception("session lease renewal failed; retrying")
        del inbox
