"""One writer process per embedded store: an OS file lock held for the store's life.

Chroma's embedded mode keeps its index in the process; two processes writing
one folder can corrupt it. `MemoryStore.open` therefore takes an exclusive
`flock` on `<store>/cyrene.lock` before Chroma touches the folder, and keeps
it until `close()`. The OS drops it when the process ends however it ends
(SIGKILL included), so a crash never leaves a stale lock.

Within one process, opening a path that is already open shares the lock (and
Chroma shares its in-process system per path too): a count of holders
releases it at the last `close()`. A forked child does not inherit the share.

`WriteLock` is narrower: it is held for one write that checks the store before it
writes (`MemoryStore.apply`: no fact stored twice), so that no other writer's write
falls between the check and the write.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memory.errors import StoreInUseError

LOCK_FILE = "cyrene.lock"
WRITE_LOCK_FILE = "cyrene-writes.lock"
DEFAULT_LOCK_TIMEOUT = 10.0
WRITE_LOCK_TIMEOUT = 30.0
"""Seconds a write waits for another writer's (a write takes milliseconds; a writer that
hangs longer fails this write, which a background extraction tries again later)."""
_POLL = 0.05
_WRITE_POLL = 0.002


@dataclass
class _Share:
    fd: int
    holders: int


_SHARES: dict[Path, _Share] = {}
_WRITERS: dict[str, threading.Lock] = {}  # a store's key → the lock its writers take here
_GUARD = threading.Lock()


class StoreLock:
    """This handle's share of the process's lock on one store folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held = True

    @classmethod
    def acquire(cls, folder: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> StoreLock:
        """Take (or share) the lock on `folder`, waiting up to `timeout` seconds.

        Raises:
            StoreInUseError: another process still holds it after `timeout`.
        """
        folder = folder.resolve()
        with _GUARD:  # held while waiting: two threads must not take two descriptors
            share = _SHARES.get(folder)
            if share is None:
                share = _SHARES[folder] = _Share(_lock(folder, timeout), 0)
            share.holders += 1
        return cls(folder)

    @property
    def shared(self) -> bool:
        """Whether another handle of this process holds the folder too (so may write it)."""
        with _GUARD:
            share = _SHARES.get(self.folder)
            return self._held and share is not None and share.holders > 1

    def release(self) -> None:
        """Give up this handle's share; the last one unlocks. Idempotent."""
        with _GUARD:
            if not self._held:
                return
            self._held = False
            share = _SHARES[self.folder]
            share.holders -= 1
            if share.holders == 0:
                del _SHARES[self.folder]
                os.close(share.fd)  # closing the only descriptor drops the flock


class WriteLock:
    """One writer at a time for a store's checked writes: the threads of this process (every
    handle on the same store shares one lock), and, when the store has a folder its
    processes share (an embedded store's is held whole by `StoreLock`; a Chroma server's
    clients may share their key ring's), the processes using it, by an exclusive `flock`
    on `<folder>/cyrene-writes.lock` taken for the write alone. Processes on a server that
    share no folder are not kept apart: Chroma offers no lock to take."""

    def __init__(
        self, store: str, folder: Path | None = None, timeout: float = WRITE_LOCK_TIMEOUT
    ) -> None:
        self.store = store
        self.folder = folder
        self.timeout = timeout

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold it for a block.

        Raises:
            StoreInUseError: another writer held it for `timeout` seconds.
        """
        with _GUARD:
            threads = _WRITERS.setdefault(self.store, threading.Lock())
        if not threads.acquire(timeout=self.timeout):
            raise StoreInUseError(self._busy())
        try:
            if self.folder is None:
                yield
                return
            fd = _flock(self.folder / WRITE_LOCK_FILE, self.timeout, _WRITE_POLL)
            if fd is None:
                raise StoreInUseError(self._busy())
            try:
                yield
            finally:
                os.close(fd)
        finally:
            threads.release()

    def _busy(self) -> str:
        return f"the memory store {self.store} had another writer for {self.timeout:g}s"


def _flock(path: Path, timeout: float, poll: float) -> int | None:
    """A descriptor holding an exclusive lock on `path`, taken within `timeout` seconds
    (None: not taken in time)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(poll)


def _lock(folder: Path, timeout: float) -> int:
    """A descriptor holding the exclusive lock, taken within `timeout` seconds."""
    fd = _flock(folder / LOCK_FILE, timeout, _POLL)
    if fd is None:
        holder = _read_holder(folder / LOCK_FILE)
        raise StoreInUseError(_in_use_message(folder, holder, timeout))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the next process's message
    return fd


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[:32].strip() or "unknown"
    except OSError:
        return "unknown"


def _in_use_message(folder: Path, holder: str, timeout: float) -> str:
    return (
        f"the memory store {folder} is in use by another process (pid {holder}); waited "
        f"{timeout:g}s. The embedded store takes one process at a time: for several "
        f"processes run a Chroma server (`chroma run --path {folder}`) and reach it with "
        "MemoryStore.connect(host, port)"
    )


def _forget_after_fork() -> None:
    """A forked child holds none of its parent's shares: it must lock for itself."""
    global _GUARD
    _GUARD = threading.Lock()  # another thread may have held it at the fork
    for share in _SHARES.values():
        os.close(share.fd)  # the parent's own descriptor keeps the lock
    _SHARES.clear()
    _WRITERS.clear()  # a parent's thread may have held one at the fork


os.register_at_fork(after_in_child=_forget_after_fork)
