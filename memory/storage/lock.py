"""One writer process per embedded store: an OS file lock held for the store's life.

Chroma's embedded mode keeps its index in the process; two processes writing
one folder can corrupt it. `MemoryStore.open` therefore takes an exclusive
`flock` on `<store>/cyrene.lock` before Chroma touches the folder, and keeps
it until `close()`. The OS drops it when the process ends however it ends
(SIGKILL included), so a crash never leaves a stale lock.

Within one process, opening a path that is already open shares the lock (and
Chroma shares its in-process system per path too): a count of holders
releases it at the last `close()`. A forked child does not inherit the share.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from memory.errors import StoreInUseError

LOCK_FILE = "cyrene.lock"
DEFAULT_LOCK_TIMEOUT = 10.0
_POLL = 0.05


@dataclass
class _Share:
    fd: int
    holders: int


_SHARES: dict[Path, _Share] = {}
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


def _lock(folder: Path, timeout: float) -> int:
    """A descriptor holding the exclusive lock, taken within `timeout` seconds."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                os.close(fd)
                raise StoreInUseError(_in_use_message(folder, holder, timeout)) from None
            time.sleep(_POLL)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the next process's message
    return fd


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
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


os.register_at_fork(after_in_child=_forget_after_fork)
