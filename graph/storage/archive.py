"""The transcript archive: a session's older messages, in a table beside its checkpoints.

A companion's owner chat never ends. Once compaction's summary covers older
messages, `compact` moves them out of the checkpointed `messages` channel into
this archive (`nodes.protocols.TranscriptArchive`), so each checkpoint, each
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
from weakref import WeakKeyDictionary

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from graph.storage.checkpoint import database_of
from nodes.protocols import TranscriptArchive

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


class SqliteArchive:
    """The archive in the SQLite checkpoint file (a short connection per call: archiving
    happens once per compaction step, reading when someone pages the history). The
    table is made by the first write, so reading never writes (`cyrene history` on a
    read-only folder)."""

    def __init__(self, path: Path, serde: SerializerProtocol) -> None:
        self.path = path
        self.serde = serde

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as conn, conn:
            yield conn

    def append(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> None:
        rows = [
            (*thread, p, m.id, *self.serde.dumps_typed(m)) for p, m in enumerate(messages, start)
        ]
        with self._connection() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} {COLUMNS.format(blob='BLOB')}")
            conn.executemany(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?)", rows)

    def read(self, thread: Thread, start: int, stop: int) -> list[BaseMessage]:
        try:
            with self._connection() as conn:
                rows = conn.execute(
                    f"SELECT type, value FROM {TABLE} WHERE thread_id = ? AND checkpoint_ns = ?"
                    " AND position >= ? AND position < ? ORDER BY position",
                    (*thread, start, stop),
                ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # nothing archived in this database yet
            raise
        return [self.serde.loads_typed((kind, value)) for kind, value in rows]


class PostgresArchive:
    """The archive in the Postgres checkpoint database."""

    def __init__(self, url: str, serde: SerializerProtocol) -> None:
        self.url = url
        self.serde = serde
        # Workers starting together on a fresh database would race on CREATE TABLE.
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (TABLE,))
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} {COLUMNS.format(blob='BYTEA')}")

    def _connection(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def append(self, thread: Thread, start: int, messages: Sequence[BaseMessage]) -> None:
        rows = [
            (*thread, p, m.id, *self.serde.dumps_typed(m)) for p, m in enumerate(messages, start)
        ]
        with self._connection() as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {TABLE} VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (thread_id, checkpoint_ns, position) DO UPDATE SET"
                " message_id = EXCLUDED.message_id, type = EXCLUDED.type, value = EXCLUDED.value",
                rows,
            )

    def read(self, thread: Thread, start: int, stop: int) -> list[BaseMessage]:
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT type, value FROM {TABLE} WHERE thread_id = %s AND checkpoint_ns = %s"
                " AND position >= %s AND position < %s ORDER BY position",
                (*thread, start, stop),
            ).fetchall()
        return [self.serde.loads_typed((kind, bytes(value))) for kind, value in rows]


_BY_SAVER: WeakKeyDictionary[BaseCheckpointSaver, TranscriptArchive] = WeakKeyDictionary()
_REGISTRY = threading.Lock()


def archive_for(saver: BaseCheckpointSaver) -> TranscriptArchive:
    """The archive beside `saver`'s checkpoints; one per saver, made on first use."""
    with _REGISTRY:
        if (archive := _BY_SAVER.get(saver)) is None:
            archive = _BY_SAVER[saver] = _open_archive(saver)
        return archive


def _open_archive(saver: BaseCheckpointSaver) -> TranscriptArchive:
    kind, where = database_of(saver)
    if kind == "sqlite":
        return SqliteArchive(Path(where), saver.serde)
    if kind == "postgres":
        return PostgresArchive(where, saver.serde)
    return ProcessArchive()


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
