"""Where the CLI keeps things, opened so that every expected failure is one line.

A data folder that is a file or read-only, a checkpoint URL naming a folder, a
file that is not a database, an unreachable Postgres: each becomes a `CliError`
that names the option and what is wrong, never a traceback. `history` opens a
SQLite database read-only, so it works on a folder nobody may write.
"""

from __future__ import annotations

import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.storage.checkpoint import POSTGRES_PREFIXES, SQLITE_PREFIX, open_checkpointer
from memory import MemoryStore
from memory.errors import MemoryStoreError
from studio.cli_text import Reembedding

# Exit codes (README "## CLI").
EXIT_OK = 0
EXIT_NOT_FOUND = 1  # nothing to resume, no such session or memory
EXIT_USAGE = 2  # bad input or an expected failure: one line on stderr
EXIT_TURN_FAILED = 75  # EX_TEMPFAIL: the turn failed after it started; `cyrene resume` finishes it

POSTGRES_CONNECT_TIMEOUT = 5  # seconds; libpq waits for the OS (minutes) without it


class CliError(Exception):
    """An expected failure: one line on stderr and an exit code, never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


def checkpoint_url(checkpoint: str | None, data: Path) -> str:
    return checkpoint or f"{SQLITE_PREFIX}{data / 'checkpoints.db'}"


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
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = Path(url[len(SQLITE_PREFIX) :])
    if path.is_dir():
        raise CliError(f"--checkpoint {url}: {path} is a folder, not a SQLite database")
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
def reading_checkpointer(url: str) -> Iterator[BaseCheckpointSaver]:
    """A saver that only reads: SQLite is opened read-only, so a read-only folder works."""
    path = _sqlite_file(url)
    if path is None:
        with checkpointer(url) as saver:
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    if not path.exists():
        raise CliError(f"--checkpoint {url}: no database at {path}", EXIT_NOT_FOUND)
    try:
        conn = _read_only(path)
    except sqlite3.Error as exc:
        raise CliError(f"--checkpoint {url}: {_reason(exc)}") from exc
    try:
        saver = SqliteSaver(conn)
        saver.is_setup = True  # its tables exist (checked); setting them up would write
        yield saver
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
    """Failures opening the memory store under `data` (in use, read-only, damaged) as `CliError`s."""
    from chromadb.errors import ChromaError

    errors: tuple[type[Exception], ...] = (MemoryStoreError, ChromaError, *_storage_errors())
    try:
        yield
    except errors as exc:
        raise CliError(f"--data {data}: cannot open the memory store: {_reason(exc)}") from exc


def open_memory(data: Path, progress: Reembedding | None = None) -> MemoryStore:
    """The embedded store under `data/memory`; re-embedding on open is shown on stderr."""
    with memory_errors(data):
        return MemoryStore.open(data / "memory", progress=progress or Reembedding())


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__
