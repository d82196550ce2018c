"""The transcript archive: a session's older messages, in a table beside its checkpoints.

A companion's owner chat never ends. Once compaction's summary covers older
messages, `compact` moves them out of the checkpointed `messages` channel into
this archive (`nodes.core.protocols.TranscriptArchive`), so each checkpoint, each
snapshot of the channel and each turn's load stay the size of the live window,
however old the session. Nothing is lost: the whole transcript is the archive
followed by the window (`CyreneGraph.transcript`, paged by position).

Where it lives follows the saver, like the session inbox: a
`cyrene_transcript_archive` table in the SQLite file or Postgres database that
`open_checkpointer` opened, else a dict in this process (the in-memory saver,
or a saver built by hand). Rows are keyed by thread, namespace and position;
writing a position again writes it whole (a `compact` step re-run after a
crash writes the same messages), and reads take one position range in order.

The archive belongs to the thread, not to a branch: forking a session from a
checkpoint older than its last archive step and compacting the fork again
rewrites the archive from that position on.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from graph.storage.checkpoint import PerSaver, database_of
from nodes.core.protocols import TranscriptArchive

TABLE = "cyrene_transcript_archive"
COLUMNS = (
    "(thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, position BIGINT NOT NULL,"
    " message_id TEXT, type TEXT NOT NULL, value {blob} NOT NULL,"
    " PRIMARY KEY (thread_id, checkpoint_ns, position))"
)
Thread = tuple[str, str]
"""(thread id, checkpoint namespace)."""


class ProcessArchive:
    """The archive of one process: for the in-memory saver and savers without a URL."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._threads: dict[Thread, dict[int, BaseMessage]] = {}

    def append(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> None:
        with self._mutex:
            rows = self._threads.setdefault(thread, {})
            rows.update(enumerate(messages, start))

    def read(self, thread: Thread, start: int, stop: int) -> list[BaseMessage]:
        with self._mutex:
            rows = self._threads.get(thread, {})
            return [rows[p] for p in range(start, stop) if p in rows]


class SqlArchive:
    """What the SQLite and Postgres archives share: the table, rows and queries."""

    mark = "?"
    """The driver's parameter marker."""
    upsert = "INSERT OR REPLACE INTO {table} VALUES ({marks})"

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    def _rows(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> list[tuple]:
        return [
            (*thread, p, m.id, *self.serde.dumps_typed(m)) for p, m in enumerate(messages, start)
        ]

    def _insert(self) -> str:
        return self.upsert.format(table=TABLE, marks=", ".join([self.mark] * 6))

    def _select(self) -> str:
        m = self.mark
        return (
            f"SELECT type, value FROM {TABLE} WHERE thread_id = {m} AND checkpoint_ns = {m}"
            f" AND position >= {m} AND position < {m} ORDER BY position"
        )

    def _messages(self, rows: Sequence[tuple[str, Any]]) -> list[BaseMessage]:
        return [self.serde.loads_typed((kind, bytes(value))) for kind, value in rows]


class SqliteArchive(SqlArchive):
    """The archive in the SQLite checkpoint file (a short connection per call: archiving
    happens once per compaction step, reading when someone pages the history). The
    table is made by the first write, so reading never writes (`cyrene history` on a
    read-only folder)."""

    def __init__(
        self, path: Path, serde: SerializerProtocol, reader: sqlite3.Connection | None = None
    ) -> None:
        super().__init__(serde)
        self.path = path
        self.reader = reader
        """A connection to read with: a reader of a read-only folder passes its read-only one."""

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as conn, conn:
            yield conn

    def append(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> None:
        with self._connection() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} {COLUMNS.format(blob='BLOB')}")
            conn.executemany(self._insert(), self._rows(thread, start, messages))

    def read(self, thread: Thread, start: int, stop: int) -> list[BaseMessage]:
        try:
            if self.reader is not None:
                return self._messages(
                    self.reader.execute(self._select(), (*thread, start, stop)).fetchall()
                )
            with self._connection() as conn:
                return self._messages(
                    conn.execute(self._select(), (*thread, start, stop)).fetchall()
                )
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # nothing archived in this database yet
            raise


class PostgresArchive(SqlArchive):
    """The archive in the Postgres checkpoint database."""

    mark = "%s"
    upsert = (
        "INSERT INTO {table} VALUES ({marks}) ON CONFLICT (thread_id, checkpoint_ns, position)"
        " DO UPDATE SET message_id = EXCLUDED.message_id, type = EXCLUDED.type,"
        " value = EXCLUDED.value"
    )

    def __init__(self, url: str, serde: SerializerProtocol) -> None:
        super().__init__(serde)
        self.url = url
        # Workers starting together on a fresh database would race on CREATE TABLE.
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (TABLE,))
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} {COLUMNS.format(blob='BYTEA')}")

    def _connection(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def append(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> None:
        with self._connection() as conn, conn.cursor() as cur:
            cur.executemany(self._insert(), self._rows(thread, start, messages))

    def read(self, thread: Thread, start: int, stop: int) -> list[BaseMessage]:
        with self._connection() as conn:
            return self._messages(conn.execute(self._select(), (*thread, start, stop)).fetchall())


def _open_archive(saver: BaseCheckpointSaver) -> TranscriptArchive:
    kind, where = database_of(saver)
    if kind == "sqlite":
        return SqliteArchive(Path(where), saver.serde)
    if kind == "postgres":
        return PostgresArchive(where, saver.serde)
    return ProcessArchive()


archive_for = PerSaver(_open_archive)
"""The archive beside a saver's checkpoints; one per saver, made on first use."""


def whole_transcript(
    archive: TranscriptArchive | None,
    thread: Thread,
    values: dict[str, Any],
    start: int = 0,
    stop: int | None = None,
) -> list[BaseMessage]:
    """Messages [start, stop) of the whole transcript: the archive, then the live window."""
    window: list[BaseMessage] = values.get("messages", [])
    archived = (values.get("archived") or {}).get("messages", 0)
    stop = archived + len(window) if stop is None else stop
    older = archive.read(thread, start, min(stop, archived)) if archive and start < archived else []
    return [*older, *window[max(start - archived, 0) : max(stop - archived, 0)]]
