"""The checkpoint tables of the SQLite and Postgres savers, as `prune_checkpoints` edits them.

Each backend does four things on the saver's own connection: list a
database's sessions, read a session's newest checkpoint ids, turn the oldest
kept checkpoints into roots that hold a full snapshot of the transcript and
delete every older checkpoint with its writes (one transaction), and give the
freed space back. Deletion goes by checkpoint id: kept checkpoints are the
newest by id (the order in which LangGraph finds a session's latest), so
everything older than the oldest kept one goes, and a checkpoint a running
turn saves meanwhile, newer by construction, is never touched.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver

from nodes.kernel.compat import DeltaSnapshot

NEWEST = (
    "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = {mark}"
    " AND checkpoint_ns = {mark} ORDER BY checkpoint_id DESC LIMIT {mark}"
)
"""`CheckpointTables.newest` in either database, with its parameter mark filled in."""


@dataclass(frozen=True)
class NewRoot:
    """A kept checkpoint whose parent is deleted: it becomes a root holding `snapshots`.

    `versions` are the snapshotted channels' versions at this checkpoint
    (Postgres stores a channel value by version).
    """

    checkpoint_id: str
    snapshots: dict[str, DeltaSnapshot]
    versions: dict[str, str]


@dataclass(frozen=True)
class Deleted:
    checkpoints: int
    writes: int


class CheckpointTables(Protocol):
    def namespaces(self, thread_ids: Sequence[str] | None) -> list[tuple[str, str]]:
        """(thread_id, checkpoint_ns) of every session (or of `thread_ids`) with checkpoints."""
        ...

    def newest(self, thread_id: str, ns: str, limit: int) -> list[tuple[str, str | None]]:
        """(checkpoint_id, parent_checkpoint_id) of the newest `limit` checkpoints, newest first."""
        ...

    def prune(self, thread_id: str, ns: str, cutoff: str, roots: Sequence[NewRoot]) -> Deleted:
        """Write `roots`, then delete the checkpoints older than `cutoff` and their writes."""
        ...

    def vacuum(self) -> None:
        """Give the space deleted rows held back to the file system (or to the tables)."""
        ...


def checkpoint_tables(saver: BaseCheckpointSaver) -> CheckpointTables:
    """The tables behind `saver`; a clear error for a saver that has none we know."""
    if isinstance(saver, SqliteSaver):
        return SqliteTables(saver)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:  # the postgres extra is not installed
        PostgresSaver = None  # type: ignore[assignment,misc]
    if PostgresSaver is not None and isinstance(saver, PostgresSaver):
        return PostgresTables(saver)
    raise TypeError(
        f"prune_checkpoints works on SqliteSaver and PostgresSaver (what open_checkpointer "
        f"returns for sqlite:/// and postgresql:// URLs), not {type(saver).__name__}"
    )


class SqliteTables:
    """`SqliteSaver`'s `checkpoints` and `writes`: the checkpoint blob holds its channel values."""

    def __init__(self, saver: SqliteSaver) -> None:
        self.saver = saver

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        # `saver.cursor()` commits even when its block raises; a prune is all or nothing.
        self.saver.setup()
        with self.saver.lock, self.saver.conn as conn:
            yield conn.cursor()

    def namespaces(self, thread_ids: Sequence[str] | None) -> list[tuple[str, str]]:
        with self._transaction() as cur:
            if thread_ids is None:
                cur.execute("SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints")
                return [tuple(row) for row in cur.fetchall()]
            return [
                (thread_id, ns)
                for thread_id in thread_ids
                for (ns,) in cur.execute(
                    "SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = ?",
                    (str(thread_id),),
                ).fetchall()
            ]

    def newest(self, thread_id: str, ns: str, limit: int) -> list[tuple[str, str | None]]:
        with self._transaction() as cur:
            cur.execute(NEWEST.format(mark="?"), (thread_id, ns, limit))
            return [tuple(row) for row in cur.fetchall()]

    def prune(self, thread_id: str, ns: str, cutoff: str, roots: Sequence[NewRoot]) -> Deleted:
        serde = self.saver.serde
        key = (thread_id, ns)
        with self._transaction() as cur:
            for root in roots:
                type_, blob = cur.execute(
                    "SELECT type, checkpoint FROM checkpoints "
                    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                    (*key, root.checkpoint_id),
                ).fetchone()
                checkpoint = serde.loads_typed((type_, blob))
                checkpoint["channel_values"].update(root.snapshots)
                cur.execute(
                    "UPDATE checkpoints SET type = ?, checkpoint = ?, parent_checkpoint_id = NULL "
                    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                    (*serde.dumps_typed(checkpoint), *key, root.checkpoint_id),
                )
            writes = cur.execute(
                "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id < ?",
                (*key, cutoff),
            ).rowcount
            checkpoints = cur.execute(
                "DELETE FROM checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id < ?",
                (*key, cutoff),
            ).rowcount
        return Deleted(checkpoints, writes)

    def vacuum(self) -> None:
        # SQLite reuses freed pages but never shrinks the file by itself; VACUUM
        # rewrites it, and the WAL it grew is truncated after.
        with self.saver.lock:
            self.saver.conn.execute("VACUUM")
            self.saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class PostgresTables:
    """`PostgresSaver`'s tables: values that are not primitives live in
    `checkpoint_blobs`, keyed by channel and version and shared by every
    checkpoint at that version; the checkpoint keeps an inline `true` where a
    snapshot is."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver

    @contextmanager
    def _cursor(self, transaction: bool = True) -> Iterator[Any]:
        from psycopg import Connection
        from psycopg.rows import tuple_row

        with self.saver.lock:
            pool = self.saver.conn
            with _same(pool) if isinstance(pool, Connection) else pool.connection() as conn:
                if transaction:
                    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                        yield cur
                else:
                    with conn.cursor(row_factory=tuple_row) as cur:
                        yield cur

    def namespaces(self, thread_ids: Sequence[str] | None) -> list[tuple[str, str]]:
        with self._cursor() as cur:
            if thread_ids is None:
                cur.execute("SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints")
            else:
                cur.execute(
                    "SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints "
                    "WHERE thread_id = ANY(%s)",
                    ([str(t) for t in thread_ids],),
                )
            return list(cur.fetchall())

    def newest(self, thread_id: str, ns: str, limit: int) -> list[tuple[str, str | None]]:
        with self._cursor() as cur:
            cur.execute(NEWEST.format(mark="%s"), (thread_id, ns, limit))
            return list(cur.fetchall())

    def prune(self, thread_id: str, ns: str, cutoff: str, roots: Sequence[NewRoot]) -> Deleted:
        key = (thread_id, ns)
        with self._cursor() as cur:
            for root in roots:
                self._write_root(cur, key, root)
            cur.execute(
                "DELETE FROM checkpoint_writes "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id < %s",
                (*key, cutoff),
            )
            writes = cur.rowcount
            cur.execute(
                "DELETE FROM checkpoints "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id < %s "
                "RETURNING checkpoint -> 'channel_versions'",
                (*key, cutoff),
            )
            deleted = [versions for (versions,) in cur.fetchall()]
            # The blobs a deleted checkpoint used that no kept one does. Only
            # those: a running turn stores a new checkpoint's blobs before the
            # checkpoint itself, and no deleted checkpoint refers to them.
            for channel, freed in _versions_by_channel(deleted).items():
                cur.execute(
                    "DELETE FROM checkpoint_blobs b "
                    "WHERE b.thread_id = %s AND b.checkpoint_ns = %s AND b.channel = %s "
                    "AND b.version = ANY(%s) AND NOT EXISTS (SELECT 1 FROM checkpoints c "
                    "WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns "
                    "AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)",
                    (*key, channel, sorted(freed)),
                )
        return Deleted(len(deleted), writes)

    def _write_root(self, cur: Any, key: tuple[str, str], root: NewRoot) -> None:
        from psycopg.types.json import Jsonb

        for channel, snapshot in root.snapshots.items():
            cur.execute(
                "INSERT INTO checkpoint_blobs "
                "(thread_id, checkpoint_ns, channel, version, type, blob) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (*key, channel, root.versions[channel], *self.saver.serde.dumps_typed(snapshot)),
            )
        markers = dict.fromkeys(root.snapshots, True)
        cur.execute(
            "UPDATE checkpoints SET parent_checkpoint_id = NULL, checkpoint = jsonb_set("
            "checkpoint, '{channel_values}', "
            "coalesce(checkpoint -> 'channel_values', '{}'::jsonb) || %s) "
            "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
            (Jsonb(markers), *key, root.checkpoint_id),
        )

    def vacuum(self) -> None:
        # Plain VACUUM (not FULL): the space is reused and trailing pages are
        # returned, without locking out the workers that share these tables.
        with self._cursor(transaction=False) as cur:
            cur.execute("VACUUM checkpoints, checkpoint_blobs, checkpoint_writes")


@contextmanager
def _same(conn: Any) -> Iterator[Any]:
    """A single connection used as a pool's `connection()` is: as is, not closed after."""
    yield conn


def _versions_by_channel(channel_versions: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """Every version each channel had in `channel_versions`, as text (blobs are keyed by it)."""
    out: dict[str, set[str]] = {}
    for versions in channel_versions:
        for channel, version in versions.items():
            out.setdefault(channel, set()).add(str(version))
    return out
