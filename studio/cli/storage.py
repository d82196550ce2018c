"""Where the CLI keeps things, opened so that every expected failure is one line.

A data folder that is a file, missing or read-only, a checkpoint URL naming a
folder or a folder that does not exist, a file that is not a database, an
unreachable Postgres: each becomes a `CliError` that names the option and
what is wrong, never a traceback. `history` and `sessions` open a SQLite
database read-only, so they work on a folder nobody may write.
"""

from __future__ import annotations

import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.storage.archive import SqliteArchive, archive_for
from graph.storage.checkpoint import POSTGRES_PREFIXES, SQLITE_PREFIX, open_checkpointer
from memory.errors import MemoryStoreError
from nodes.core.protocols import TranscriptArchive
from studio.cli.errors import EXIT_NOT_FOUND, CliError
from studio.memory_server import open_store
from studio.text import Reembedding

if TYPE_CHECKING:
    import argparse

    from memory.store import MemoryStore

POSTGRES_CONNECT_TIMEOUT = 5  # seconds; libpq waits for the OS (minutes) without it


def data_folder(path: Path, *, write: bool) -> Path:
    """`--data` as a usable folder: created when missing, and checked writable when `write`."""
    if path.exists() and not path.is_dir():
        raise CliError(f"--data {path}: not a folder")
    if not write:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Trying is the only sure test: `os.access` says yes to root on a read-only mount.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise CliError(f"--data {path}: cannot write there ({exc.strerror})") from exc
    return path


def existing_data(path: Path) -> Path:
    """`--data` for reading what is stored there: a missing folder is "not found", not a
    blank listing (nor a new empty store)."""
    if not path.exists():
        raise CliError(f"--data {path}: no such folder", EXIT_NOT_FOUND)
    return data_folder(path, write=False)


def stored_data(args: argparse.Namespace) -> None:
    """For a command that reads stored sessions: `--data` must exist, unless `--checkpoint`
    names the database elsewhere."""
    if args.checkpoint:
        data_folder(args.data, write=False)
    else:
        existing_data(args.data)


def writable_data(args: argparse.Namespace) -> Path:
    return data_folder(args.data, write=True)


def checkpoint_url(args: argparse.Namespace) -> str:
    """`--checkpoint`, else the SQLite file in the data folder."""
    return args.checkpoint or f"{SQLITE_PREFIX}{args.data / 'checkpoints.db'}"


def _storage_errors() -> tuple[type[Exception], ...]:
    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)
    try:
        import psycopg
    except ImportError:
        return errors
    return (*errors, psycopg.Error)


def _with_connect_timeout(url: str) -> str:
    """A Postgres URL that gives up after a few seconds on a host that does not answer."""
    if not url.startswith(POSTGRES_PREFIXES):
        return url
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    if "connect_timeout" in query:
        return url
    extra = f"connect_timeout={POSTGRES_CONNECT_TIMEOUT}"
    return parts._replace(query=f"{parts.query}&{extra}" if parts.query else extra).geturl()


def _sqlite_file(url: str) -> Path | None:
    """The file a `sqlite:///` URL names. Its folder must exist: a mistyped path would
    otherwise create folders wherever the command runs."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = Path(url[len(SQLITE_PREFIX) :])
    if path.is_dir():
        raise CliError(f"--checkpoint {url}: {path} is a folder, not a SQLite database")
    if not path.parent.is_dir():
        where = "absolute" if path.is_absolute() else "relative to the current folder"
        raise CliError(
            f"--checkpoint {url}: no folder {path.parent} ({where}; sqlite:///x.db is "
            "relative, sqlite:////x.db absolute)"
        )
    return path


@contextmanager
def checkpointer(url: str) -> Iterator[BaseCheckpointSaver]:
    """`open_checkpointer(url)`, with the failures a user can cause as `CliError`s."""
    _sqlite_file(url)
    opener = open_checkpointer(_with_connect_timeout(url))
    try:
        saver = opener.__enter__()
    except _storage_errors() as exc:
        raise CliError(f"--checkpoint {url}: {_reason(exc)}") from exc
    try:
        yield saver
    finally:
        opener.__exit__(None, None, None)


@contextmanager
def reading(args: argparse.Namespace) -> Iterator[tuple[BaseCheckpointSaver, TranscriptArchive]]:
    """A saver that only reads, and the transcript archive beside it. SQLite is opened
    read-only (a read-only folder works), and a missing database is "not found"."""
    stored_data(args)
    url = checkpoint_url(args)
    path = _sqlite_file(url)
    if path is None:
        with checkpointer(url) as saver:
            yield saver, archive_for(saver)
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    if not path.exists():
        where = f"--checkpoint {url}" if args.checkpoint else f"--data {args.data}"
        raise CliError(f"{where}: no sessions yet (no database at {path})", EXIT_NOT_FOUND)
    try:
        conn = _read_only(path)
    except sqlite3.Error as exc:
        raise CliError(f"--checkpoint {url}: {_reason(exc)}") from exc
    try:
        saver = SqliteSaver(conn)
        saver.is_setup = True  # its tables exist (checked); setting them up would write
        yield saver, SqliteArchive(path, saver.serde, reader=conn)
    finally:
        conn.close()


def _read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to a checkpoint database whose tables exist.

    A WAL database needs its lock files; in a folder that cannot hold them,
    the file is opened `immutable` (nobody can be writing it from there)."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        return _probe(sqlite3.connect(uri, uri=True, check_same_thread=False))
    except sqlite3.OperationalError:
        return _probe(sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False))


def _probe(conn: sqlite3.Connection) -> sqlite3.Connection:
    try:
        conn.execute("SELECT 1 FROM checkpoints LIMIT 1").fetchall()
    except sqlite3.Error:
        conn.close()
        raise
    return conn


@contextmanager
def memory_errors(data: Path) -> Iterator[None]:
    """Failures opening the memory store of `data` (in use, read-only, damaged, its server
    gone) as `CliError`s."""
    from chromadb.errors import ChromaError

    errors: tuple[type[Exception], ...] = (MemoryStoreError, ChromaError, *_storage_errors())
    try:
        yield
    except errors as exc:
        raise CliError(f"--data {data}: cannot open the memory store: {_reason(exc)}") from exc


def open_memory(args: argparse.Namespace, progress: Reembedding | None = None) -> MemoryStore:
    """The data folder's memory store: on `--memory-server` or the server `cyrene studio`
    runs for the folder, else embedded under `DATA/memory`; re-embedding is shown on stderr."""
    with memory_errors(args.data):
        return open_store(args.data, args.memory_server, progress=progress or Reembedding())


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__
