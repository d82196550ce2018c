"""The session inbox's two databases: SQLite (a lock row) and Postgres (advisory locks).

Both keep the inbox table of `graph.sessions.sql`; they differ in how a
session's turn is locked and how writers of its rows are kept apart.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from graph.sessions.inbox import WAITING
from graph.sessions.sql import INBOX, LEASE, SqlInbox, log


class SqliteInbox(SqlInbox):
    """The inbox in the SQLite checkpoint file: a lock row per busy session."""

    def __init__(self, path: Path, serde: SerializerProtocol) -> None:
        self.path = path
        super().__init__(serde)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # Lock rows need no fsync: after a power loss no turn holds a session anyway.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _ddl(self) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {INBOX} (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
            " thread_id TEXT NOT NULL, ticket TEXT NOT NULL UNIQUE, grp TEXT, status TEXT NOT NULL,"
            " payload_type TEXT, payload BLOB, checkpoint_id TEXT, host TEXT NOT NULL,"
            " pid INTEGER NOT NULL, expires REAL NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {INBOX}_thread ON {INBOX} (thread_id, seq)",
            # WITHOUT ROWID: one b-tree, keyed by thread, where a rowid table needs its rows and
            # an index: a lock and its release each write half the pages.
            "CREATE TABLE IF NOT EXISTS cyrene_session_locks (thread_id TEXT PRIMARY KEY,"
            " ticket TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, expires REAL NOT NULL)"
            " WITHOUT ROWID",
        ]

    @contextmanager
    def _write(self, thread_id: str | None = None) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _lock(self, thread_id: str, ticket: str) -> bool:
        holder = self._run(
            "SELECT ticket, host, pid, expires FROM cyrene_session_locks WHERE thread_id = ?",
            (thread_id,),
        )
        # A row of this process for a session it does not hold is left from a failed release.
        if holder and not self._is_me(*holder[0][:3]) and self._alive(*holder[0]):
            return False
        self._run(
            "INSERT OR REPLACE INTO cyrene_session_locks (thread_id, ticket, host, pid, expires)"
            " VALUES (?, ?, ?, ?, ?)",
            (thread_id, ticket, self.host, os.getpid(), time.time() + LEASE),
        )
        return True

    def _quick_lock(self, thread_id: str, ticket: str) -> bool:
        try:
            cursor = self._conn.execute(
                "INSERT INTO cyrene_session_locks (thread_id, ticket, host, pid, expires)"
                f" SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM {INBOX}"
                " WHERE thread_id = ? AND status = ?)",
                (
                    thread_id,
                    ticket,
                    self.host,
                    os.getpid(),
                    time.time() + LEASE,
                    thread_id,
                    WAITING,
                ),
            )
        except sqlite3.IntegrityError:
            return False  # a lock row: a holder, or one a dead process left
        return cursor.rowcount == 1

    def _unlock(self, thread_id: str, ticket: str, *, committed: bool) -> None:
        if not committed:
            self._run(
                "DELETE FROM cyrene_session_locks WHERE thread_id = ? AND ticket = ?",
                (thread_id, ticket),
            )

    def _renew_locks(self, expires: float) -> None:
        self._run(
            "UPDATE cyrene_session_locks SET expires = ? WHERE host = ? AND pid = ?",
            (expires, self.host, os.getpid()),
        )


class PostgresInbox(SqlInbox):
    """The inbox in the Postgres checkpoint database: advisory locks on one
    connection of this process, which the server releases if the process dies."""

    placeholder = "%s"

    def __init__(self, url: str, serde: SerializerProtocol) -> None:
        self.url = url
        super().__init__(serde)

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def _ddl(self) -> list[str]:
        return [
            # Concurrent CREATE TABLE IF NOT EXISTS can fail (pg_type unique violation)
            # when workers start together on a fresh database: one setup at a time.
            f"SELECT pg_advisory_xact_lock({_key('setup', INBOX)})",
            f"CREATE TABLE IF NOT EXISTS {INBOX} (seq BIGSERIAL PRIMARY KEY,"
            " thread_id TEXT NOT NULL, ticket TEXT NOT NULL UNIQUE, grp TEXT, status TEXT NOT NULL,"
            " payload_type TEXT, payload BYTEA, checkpoint_id TEXT, host TEXT NOT NULL,"
            " pid INTEGER NOT NULL, expires DOUBLE PRECISION NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {INBOX}_thread ON {INBOX} (thread_id, seq)",
        ]

    def _connected(self) -> Any:
        if self._conn.closed:
            log.error("the session-lock connection to Postgres dropped; reconnecting")
            self._held.clear()  # the server released them with the connection
            self._conn = self._connect()
            self._conns.append(self._conn)
        return self._conn

    @contextmanager
    def _write(self, thread_id: str | None = None) -> Iterator[None]:
        with self._connected().transaction():
            if thread_id is not None:
                # Writers of one session's rows queue here, as BEGIN IMMEDIATE makes them in SQLite.
                self._run("SELECT pg_advisory_xact_lock(?)", (_key("inbox", thread_id),))
            yield

    def _lock(self, thread_id: str, ticket: str) -> bool:
        return bool(self._run("SELECT pg_try_advisory_lock(?)", (_key("turn", thread_id),))[0][0])

    def _quick_lock(self, thread_id: str, ticket: str) -> bool:
        # Postgres skips the select list when the one-time WHERE fails: no lock is taken then.
        self._connected()
        taken = self._run(
            f"SELECT pg_try_advisory_lock(?) WHERE NOT EXISTS (SELECT 1 FROM {INBOX}"
            " WHERE thread_id = ? AND status = ?)",
            (_key("turn", thread_id), thread_id, WAITING),
        )
        return bool(taken and taken[0][0])

    def _unlock(self, thread_id: str, ticket: str, *, committed: bool) -> None:
        if committed:
            # After the commit, so the next holder reads the answered rows.
            self._run("SELECT pg_advisory_unlock(?)", (_key("turn", thread_id),))


def _key(kind: str, thread_id: str) -> int:
    """A 64-bit advisory-lock key for the session (a collision only serializes two sessions)."""
    digest = hashlib.blake2b(f"cyrene-{kind}:{thread_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
