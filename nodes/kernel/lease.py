"""Whether the holder of a lease still runs: one rule for every lease Cyrene keeps.

Two kinds of record are leased to a process: a claim on a background
extraction (`nodes.extraction.ledger`) and a call waiting in, or holding, a
session (`graph.sessions.sql`). Both name their holder by host, pid and the
life token of the process (drawn when this module is first imported, so a
process that reuses the pid of a dead one is a new holder), and carry a
wall-clock expiry that the holder keeps renewing. A holder counts as alive
while its lease runs, unless this host can see it is gone:

- its pid no longer runs here, or runs as a zombie (killed, not yet reaped:
  it will never renew anything again);
- it is an earlier life of this very pid (another life token), which cannot
  be running since this process is.

This process's own leases always count as alive: it renews them itself. On
another host only the expiry can tell.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

LIFE = uuid.uuid4().hex[:12]
"""This process's life token (a forked child has its own pid, so it is a holder of its own)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: a process, by host, pid and life token."""

    host: str
    pid: int
    life: str

    @classmethod
    def this_process(cls) -> Holder:
        """This process (the pid is read now, so after a fork the child is another holder)."""
        return cls(socket.gethostname(), os.getpid(), LIFE)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """A holder from `host/pid/life` (as `str` writes it); None when it is not one."""
        host, _, rest = text.partition("/")
        pid, _, life = rest.partition("/")
        return cls(host, int(pid), life) if pid.isdigit() else None

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.life}"


def pid_running(pid: int) -> bool:
    """Whether `pid` runs on this host; a zombie (killed, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: nothing more to see
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def holder_alive(holder: Holder | None, expires: float, now: float | None = None) -> bool:
    """Whether a lease held by `holder` until `expires` (wall clock) still holds.

    Args:
        holder: the lease's holder; None for one that names no process this rule
            can read (only its expiry counts then).
        expires: when the lease runs out unless renewed (`time.time()` seconds).
        now: the wall clock to judge by (default: now).

    Returns:
        True for this process's own leases, and for another holder whose lease
        has not run out and who is not visibly gone (see the module docstring).
    """
    me = Holder.this_process()
    if holder == me:
        return True
    if expires <= (time.time() if now is None else now):
        return False
    if holder is None or holder.host != me.host:
        return True
    return holder.pid != me.pid and pid_running(holder.pid)
