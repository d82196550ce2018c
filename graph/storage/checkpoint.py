"""`open_checkpointer(url)`: one URL, a sync or async saver, closed on exit.

    with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver: ...   # invoke / stream
    async with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver: ...  # ainvoke / astream

Schemes: `memory` (in-process: LangGraph's `InMemorySaver`, loading only what changed
since a thread's last load; `nodes.kernel.compat.savers`),
`sqlite:///relative/path` or `sqlite:////abs/path` (the embedded default; a sync
saver loads incrementally too),
`postgresql://…` (scale-out, loading incrementally too; needs the `postgres` extra).
Tables are created on entry, so a fresh database works at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import Any, Generic, TypeVar
from weakref import WeakKeyDictionary

from langgraph.checkpoint.base import BaseCheckpointSaver

from nodes.kernel.compat.savers import (
    IncrementalMemorySaver,
    IncrementalSqliteSaver,
    incremental_postgres_saver,
    keyed_async_postgres_saver,
)
from nodes.kernel.extras import missing_extra

T = TypeVar("T")
SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")
_URLS: WeakKeyDictionary[BaseCheckpointSaver, str] = WeakKeyDictionary()


def saver_url(saver: BaseCheckpointSaver) -> str | None:
    """The URL `open_checkpointer` opened `saver` from (None for any other saver):
    the session lock reaches the same database by it."""
    return _URLS.get(saver)


class PerSaver(Generic[T]):
    """One `T` per saver, made by `make(saver)` on first use: thread-safe, and forgotten with
    the saver (the session inbox and the transcript archive are kept this way)."""

    def __init__(self, make: Callable[[BaseCheckpointSaver], T]) -> None:
        self._make = make
        self._mutex = threading.Lock()
        self._made: WeakKeyDictionary[BaseCheckpointSaver, T] = WeakKeyDictionary()

    def __call__(self, saver: BaseCheckpointSaver) -> T:
        with self._mutex:
            if (made := self._made.get(saver)) is None:
                made = self._made[saver] = self._make(saver)
            return made


def database_of(saver: BaseCheckpointSaver) -> tuple[str, str]:
    """Which database `saver` writes to: ("sqlite", absolute path), ("postgres", URL), or
    ("process", "") for the in-memory saver and savers built by hand (no URL to reach
    their database by). The session inbox and the transcript archive live there too."""
    url = saver_url(saver) or ""
    if url.startswith(SQLITE_PREFIX):
        return "sqlite", str(Path(url[len(SQLITE_PREFIX) :]).resolve())
    if url.startswith(POSTGRES_PREFIXES):
        return "postgres", url
    return "process", ""


def sqlite_path(url: str) -> Path:
    """The file a `sqlite:///…` URL names, with its folder created."""
    path = Path(url[len(SQLITE_PREFIX) :])
    if not str(path) or str(path) == ".":
        raise ValueError(f"checkpoint URL {url!r}: no database path after 'sqlite:///'")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def open_checkpointer(url: str) -> CheckpointerOpener:
    """A checkpointer for `url`: a sync saver under `with`, an async one under `async with`.

    Tables are created on entry and the connection is closed on exit, so a
    fresh database works at once and nothing is left open.

    Args:
        url: `"memory"`, `"sqlite:///relative/path"` / `"sqlite:////abs/path"`
            (the embedded default; the folder is created), or
            `"postgresql://…"` (needs the `postgres` extra).

    Returns:
        On entry, a LangGraph `BaseCheckpointSaver` for `build_graph`.

    Raises:
        ValueError: the URL has another scheme, names no SQLite file, or
            needs the `postgres` extra that is not installed.

    Example:
        >>> with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        ...     graph = build_graph(config, checkpointer=saver)
        >>> async with open_checkpointer("postgresql://postgres@127.0.0.1/test") as saver:
        ...     graph = build_graph(config, checkpointer=saver)
    """
    return CheckpointerOpener(url)


class CheckpointerOpener(AbstractContextManager, AbstractAsyncContextManager):
    """The saver at a checkpoint URL, opened on entry and closed on exit
    (`open_checkpointer` makes one).

    Raises:
        ValueError: the URL has another scheme.
    """

    def __init__(self, url: str) -> None:
        url = url.strip()
        if not (
            url == "memory" or url.startswith(SQLITE_PREFIX) or url.startswith(POSTGRES_PREFIXES)
        ):
            raise ValueError(
                f"checkpoint URL {url!r}: expected 'memory', 'sqlite:///path' or 'postgresql://…'"
            )
        self.url = url
        self._stack: ExitStack | None = None
        self._astack: AsyncExitStack | None = None

    def __enter__(self) -> BaseCheckpointSaver:
        self._stack = ExitStack()
        if self.url == "memory":
            return IncrementalMemorySaver()
        if self.url.startswith(SQLITE_PREFIX):
            saver = self._stack.enter_context(
                IncrementalSqliteSaver.from_conn_string(str(sqlite_path(self.url)))
            )
        else:
            _postgres()
            saver = self._stack.enter_context(
                incremental_postgres_saver().from_conn_string(self.url)
            )
        with _one_setup_at_a_time(self.url):
            saver.setup()
        _URLS[saver] = self.url
        return saver

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            self._stack.close()

    async def __aenter__(self) -> BaseCheckpointSaver:
        self._astack = AsyncExitStack()
        if self.url == "memory":
            return IncrementalMemorySaver()
        if self.url.startswith(SQLITE_PREFIX):
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            saver = await self._astack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(str(sqlite_path(self.url)))
            )
        else:
            _postgres()
            saver = await self._astack.enter_async_context(
                keyed_async_postgres_saver().from_conn_string(self.url)
            )
        async with _aone_setup_at_a_time(self.url):
            await saver.setup()
        _URLS[saver] = self.url
        return saver

    async def __aexit__(self, *exc_info: object) -> None:
        if self._astack is not None:
            await self._astack.aclose()


_SETUP_LOCK = 0x6379_7265_6E65  # an advisory-lock key of its own ("cyrene")
_SETUP_POLL = 0.05
_TRY_SETUP_LOCK = "SELECT pg_try_advisory_lock(%s)"


def _took(row: tuple[Any, ...] | None) -> bool:
    """Whether `pg_try_advisory_lock` answered true."""
    return bool(row and row[0])


@contextmanager
def _one_setup_at_a_time(url: str) -> Iterator[None]:
    """LangGraph's `PostgresSaver.setup` fails when several processes first open a
    fresh database at once (duplicate migration rows, deadlocks): workers starting
    together take turns through an advisory lock held on a connection of its own.

    Waiters poll instead of blocking in `pg_advisory_lock`: a blocked statement is an
    open transaction, and the holder's `CREATE INDEX CONCURRENTLY` would wait for it."""
    if not url.startswith(POSTGRES_PREFIXES):
        yield
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not _took(conn.execute(_TRY_SETUP_LOCK, (_SETUP_LOCK,)).fetchone()):
            time.sleep(_SETUP_POLL)
        yield  # closing the connection releases the lock


@asynccontextmanager
async def _aone_setup_at_a_time(url: str) -> AsyncIterator[None]:
    """`_one_setup_at_a_time` for an async saver."""
    if not url.startswith(POSTGRES_PREFIXES):
        yield
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not _took(await (await conn.execute(_TRY_SETUP_LOCK, (_SETUP_LOCK,))).fetchone()):
            await asyncio.sleep(_SETUP_POLL)
        yield


def _postgres() -> None:
    """The `postgres` extra is installed, or a clear error says how to get it."""
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError as exc:
        raise ValueError(missing_extra("postgres", "postgresql:// checkpoints")) from exc
