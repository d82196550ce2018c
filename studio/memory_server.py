"""One memory store for Studio and the CLI at once: a `chroma run` server over `DATA/memory`.

The embedded store belongs to one process (`memory.storage.lock`), so while
Studio's server held it, `cyrene run` on the same data folder waited and
failed. `cyrene studio` therefore serves the folder's store through a Chroma
server of its own: it takes the folder's lock (so nothing opens the files
beside the server), starts `chroma run --path DATA/memory` on a free port of
127.0.0.1, and records it in `DATA/memory-server.json`. Every process on that
data folder (Studio's graph, each `cyrene` command) finds the record and
connects to the server instead of opening the files; when Studio stops, the
server stops, the record goes, and the next command opens the files again.
A Chroma server elsewhere is reached with `--memory-server HOST:PORT`
(`$CYRENE_MEMORY_SERVER`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodes.kernel.lease import pid_running

if TYPE_CHECKING:
    from memory.store import MemoryStore

RECORD = "memory-server.json"
START_TIMEOUT = 60.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class MemoryServer:
    """A Chroma server serving a data folder's memories."""

    host: str
    port: int
    pid: int | None = None
    """The server's process, when this machine runs it (`cyrene studio` records it)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def answers(self) -> bool:
        """Whether its process lives (when known) and its port accepts a connection."""
        if self.pid is not None and not pid_running(self.pid):
            return False
        with socket.socket() as probe:
            probe.settimeout(1.0)
            return probe.connect_ex((self.host, self.port)) == 0


def parse_address(text: str) -> MemoryServer:
    """`HOST:PORT` (`--memory-server`, `$CYRENE_MEMORY_SERVER`) as a server.

    Raises:
        ValueError: not of that form, or the port is not 1–65535.
    """
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--memory-server {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8000")
    return MemoryServer(host, int(port))


def recorded_server(data: Path) -> MemoryServer | None:
    """The server `cyrene studio` recorded for `data`, if it still answers."""
    try:
        server = MemoryServer(**json.loads((data / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return server if server.answers() else None


def memory_server(data: Path, address: str | None) -> MemoryServer | None:
    """Where `data`'s memories are served: `address` when given, else what `cyrene studio`
    recorded for the folder, else None (the embedded store under `data/memory`)."""
    recorded = recorded_server(data)
    if not address:
        return recorded
    given = parse_address(address)
    # The address of the folder's own server (Studio hands it to its graph) is that server,
    # key ring and all: its clients must open what the CLI sealed, and the reverse.
    return recorded if recorded is not None and recorded.address == given.address else given


def open_store(data: Path, address: str | None = None, **options: Any) -> MemoryStore:
    """The data folder's memory store: on its server (see `memory_server`) or embedded.

    Args:
        data: the data folder.
        address: `HOST:PORT` of a Chroma server to use instead.
        **options: passed to `MemoryStore.connect` / `MemoryStore.open` (`progress`, …).
    """
    from memory.store import MemoryStore

    server = memory_server(data, address)
    if server is None:
        return MemoryStore.open(data / "memory", **options)
    # The server `cyrene studio` runs serves this folder: its clients share the key ring.
    keys = data / "memory" if server.pid is not None else None
    return MemoryStore.connect(server.host, server.port, keys=keys, **options)


def chroma_binary() -> str:
    """The `chroma` command the chromadb wheel installs beside this interpreter."""
    return shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))


def start_server(data: Path) -> tuple[subprocess.Popen[bytes], MemoryServer]:
    """Serve `data/memory` with `chroma run` on a free port of 127.0.0.1 and record it.

    The server dies with this process (Linux: the parent-death signal), so a
    killed Studio leaves no server writing the folder behind its lock.

    Raises:
        RuntimeError: the server did not answer within `START_TIMEOUT` seconds.
    """
    port = _free_port()
    log = (data / "memory-server.log").open("wb")
    process = subprocess.Popen(
        [
            chroma_binary(),
            "run",
            "--path",
            str(data / "memory"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        preexec_fn=_die_with_parent,
    )
    server = MemoryServer("127.0.0.1", port, process.pid)
    deadline = time.monotonic() + START_TIMEOUT
    while not server.answers():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(data, process)
            raise RuntimeError(f"`chroma run` did not start; see {data / 'memory-server.log'}")
        time.sleep(0.1)
    (data / RECORD).write_text(json.dumps(asdict(server)))
    return process, server


def stop_server(data: Path, process: subprocess.Popen[bytes]) -> None:
    """Forget the record, then stop the server (gracefully, then for good)."""
    (data / RECORD).unlink(missing_ok=True)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
