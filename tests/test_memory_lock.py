"""One writer process per embedded store (issue 13): a second process waits, then fails clearly."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memory import MemoryItem, MemoryStore, Scope, StoreInUseError
from memory.storage.lock import LOCK_FILE
from tests.conftest import REPO

pytestmark = pytest.mark.slow

HOLDER = """
import sys
from memory import MemoryItem, MemoryStore, Scope
store = MemoryStore.open(sys.argv[1])
store.add(MemoryItem(content="子进程写的记忆", scope=Scope.USER))
print("holding", flush=True)
sys.stdin.readline()
store.close()
print("closed", flush=True)
sys.stdin.readline()
"""


class Holder:
    """Another process with the store open, as a second worker or a forgotten `cyrene chat` is."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "holding"

    def tell(self, expect: str) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == expect

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def holder(tmp_path):
    held = Holder(tmp_path / "m")
    yield held
    held.stop()


def test_a_second_process_waits_then_fails_pointing_to_a_server(tmp_path, holder):
    started = time.monotonic()
    with pytest.raises(StoreInUseError) as raised:
        MemoryStore.open(tmp_path / "m", lock_timeout=1.0)
    waited = time.monotonic() - started
    assert 1.0 <= waited < 3.0, f"waited {waited:.2f}s for a 1 s bound"
    message = str(raised.value)
    assert str(holder.proc.pid) in message and str(tmp_path / "m") in message
    assert "chroma run" in message and "MemoryStore.connect" in message

    holder.tell("closed")  # close() lets go while the process lives on
    with MemoryStore.open(tmp_path / "m", lock_timeout=0) as store:
        assert [i.content for i in store.list()] == ["子进程写的记忆"]


def test_the_wait_ends_when_the_holder_is_killed(tmp_path, holder):
    threading.Timer(1.0, holder.proc.kill).start()  # SIGKILL: the OS drops the lock
    started = time.monotonic()
    with MemoryStore.open(tmp_path / "m", lock_timeout=20) as store:
        waited = time.monotonic() - started
        assert 0.8 <= waited < 10, f"opened after {waited:.2f}s"
        store.add(MemoryItem(content="第二个进程写的", scope=Scope.USER))
        assert {i.content for i in store.list()} == {"第二个进程写的", "子进程写的记忆"}


def lock_is_free(path: Path) -> bool:
    """Whether another open file description could take the lock now (as another process would)."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_one_process_may_open_a_path_twice_and_the_last_close_lets_go(tmp_path):
    first = MemoryStore.open(tmp_path / "m", lock_timeout=0)
    second = MemoryStore.open(tmp_path / ".." / tmp_path.name / "m", lock_timeout=0)
    first.add(MemoryItem(content="一个进程里的两个句柄", scope=Scope.USER))
    assert [i.content for i in second.list()] == ["一个进程里的两个句柄"]
    assert not lock_is_free(tmp_path / "m")
    first.close()
    first.close()  # a second close must not release the other handle's share
    assert not lock_is_free(tmp_path / "m")
    assert second.search("两个句柄")
    second.close()
    assert lock_is_free(tmp_path / "m")
