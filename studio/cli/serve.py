"""`cyrene studio`: `langgraph dev` for this repo, beside the CLI on one data folder.

It checks first that the `[studio]` extra is installed and that this is a
source checkout (langgraph.json), and says what to run when not, before it
prints any URL. Then it serves the folder's memories through a Chroma server
(`studio.memory_server`), so `cyrene run`, `chat` and `memory` work on the same
folder while Studio runs, and starts `langgraph dev` with flags that suit an
offline machine. Both share `DATA/checkpoints.db`: a session started in one
is read and continued in the other. Ctrl-C (or SIGTERM) stops the dev server,
then the memory server.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from nodes.kernel.extras import install_command
from studio.cli.errors import CliError
from studio.cli.storage import writable_data
from studio.memory_server import start_server, stop_server
from studio.settings import (
    CHECKPOINT_ENV,
    DATA_ENV,
    GROUP_REPLY_ENV,
    MEMORY_SERVER_ENV,
    MODEL_ENV,
)

REPO = Path(__file__).resolve().parents[2]  # studio/cli/serve.py → the clone
HOST = "127.0.0.1"

OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",  # no analytics ping
    "LANGGRAPH_NO_VERSION_CHECK": "true",  # no PyPI version check
    "LANGSMITH_TRACING": "false",
}


def langgraph_binary() -> str | None:
    """`langgraph` from the `[studio]` extra (langgraph-cli with its in-memory server), or None."""
    if importlib.util.find_spec("langgraph_api") is None:
        return None
    return shutil.which("langgraph") or _beside_python("langgraph")


def _beside_python(name: str) -> str | None:
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else None


def dev_command(port: int) -> list[str]:
    """`langgraph dev` without a browser or a reload loop (the data folder changes every turn)."""
    binary = langgraph_binary() or "langgraph"
    return [
        binary,
        "dev",
        "--no-browser",
        "--no-reload",
        "--host",
        HOST,
        "--port",
        str(port),
        "--config",
        str(REPO / "langgraph.json"),
    ]


def free_port(requested: int) -> int:
    """`requested` when nothing listens there, else a free port the OS picks. Chosen here
    because `langgraph dev` would move on its own and the URLs printed first be wrong."""
    for candidate in (requested, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((HOST, candidate))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise CliError(f"--port {requested}: no free port on {HOST}")


def dev_env(
    data: Path,
    group_reply: str | None = None,
    *,
    memory_server: str | None = None,
    checkpoint: str | None = None,
    model: str | None = None,
) -> dict[str, str]:
    """The dev server's environment: offline flags, and the CLI's settings for Studio's graph."""
    settings = {
        DATA_ENV: str(Path(data).resolve()),
        GROUP_REPLY_ENV: group_reply,
        MEMORY_SERVER_ENV: memory_server,
        CHECKPOINT_ENV: checkpoint,
        MODEL_ENV: model,
    }
    return {**os.environ, **OFFLINE_ENV, **{k: v for k, v in settings.items() if v}}


def studio_command(args: argparse.Namespace) -> int:
    """Check, start the memory server, run `langgraph dev` until it stops, then stop both."""
    if not (REPO / "langgraph.json").exists():
        raise CliError(f"cyrene studio needs the source checkout (no langgraph.json in {REPO})")
    if langgraph_binary() is None:
        raise CliError(
            f"cyrene studio needs the studio extra (langgraph-cli): {install_command('studio')}"
        )
    data = writable_data(args)
    from memory.storage.lock import StoreLock

    (data / "memory").mkdir(exist_ok=True)
    lock = StoreLock.acquire(data / "memory")  # nothing opens the files beside the server
    try:
        memory, server = start_server(data)
    except BaseException:
        lock.release()
        raise
    try:
        env = dev_env(
            data,
            args.group_reply,
            memory_server=server.address,
            checkpoint=args.checkpoint,
            model=args.model,
        )
        port = free_port(args.port)
        if port != args.port:
            print(f"cyrene: port {args.port} is in use; serving on {port}", file=sys.stderr)
        print(f"API:    http://{HOST}:{port}  (docs at /docs)")
        print(f"Studio: https://smith.langchain.com/studio/?baseUrl=http://{HOST}:{port}")
        print(f"Memory: {server.address} (the CLI on {data} uses it meanwhile)", flush=True)
        return _run_until_stopped(dev_command(port), env)
    finally:
        stop_server(data, memory)
        lock.release()


def _run_until_stopped(command: list[str], env: dict[str, str]) -> int:
    """Run the dev server in the foreground; SIGINT and SIGTERM are passed on to it."""
    dev = subprocess.Popen(command, cwd=REPO, env=env)

    def pass_on(signum: int, _frame: object) -> None:
        dev.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return dev.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
