"""One rule for "does the holder of a lease still run", shared by the session inbox's rows
and the extraction ledger's claims (`nodes.kernel.lease`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graph.sessions.sql import holder_of
from nodes.extraction.ledger import Record, claimable
from nodes.kernel.lease import LIFE, Holder, holder_alive, pid_running

LATER = time.time() + 3600


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


@pytest.fixture
def zombie() -> Iterator[int]:
    """A real child process that has exited and that nobody has reaped yet."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while state(child.pid) != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    yield child.pid
    child.wait()


@pytest.fixture
def running_child() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def here(pid: int, life: str = "another-life") -> Holder:
    return Holder(socket.gethostname(), pid, life)


def test_a_zombie_holds_no_lease(zombie):
    assert not pid_running(zombie)
    assert not holder_alive(here(zombie), LATER), "killed but unreaped: it never renews again"
    claim = Record("running", 1, str(here(zombie)), LATER)
    assert claimable(claim, time.time()), "an extraction a zombie claimed is free at once"


def test_a_running_process_holds_its_lease_until_it_runs_out(running_child):
    assert holder_alive(here(running_child), LATER)
    assert not holder_alive(here(running_child), time.time() - 1), "its lease ran out"
    claim = Record("running", 1, str(here(running_child)), LATER)
    assert not claimable(claim, time.time())


def test_an_earlier_life_of_this_pid_is_gone_and_this_process_is_alive():
    assert not holder_alive(here(os.getpid()), LATER), "another life token: a dead process"
    assert holder_alive(Holder.this_process(), time.time() - 1), "its own leases, even late"
    assert Holder.this_process().life == LIFE


def test_on_another_host_only_the_expiry_tells():
    elsewhere = Holder("elsewhere.invalid", 1, "x")
    assert holder_alive(elsewhere, LATER)
    assert not holder_alive(elsewhere, time.time() - 1)
    assert holder_alive(None, LATER) and not holder_alive(None, time.time() - 1)


def test_a_holder_reads_back_from_its_text_and_from_a_session_ticket():
    me = Holder.this_process()
    assert Holder.parse(str(me)) == me
    assert Holder.parse("host/not-a-pid/x") is None
    ticket = f"{LIFE}-{os.getpid()}-7"
    assert holder_of(ticket, me.host, me.pid) == me
    assert holder_of(ticket.replace(LIFE, "0" * 12), me.host, me.pid) != me
