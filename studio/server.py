"""`cyrene studio`: run `langgraph dev` for this repo with flags that suit an offline machine."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from studio.demo import DATA_ENV, GROUP_REPLY_ENV

REPO = Path(__file__).resolve().parent.parent

OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",  # no analytics ping
    "LANGGRAPH_NO_VERSION_CHECK": "true",  # no PyPI version check
    "LANGSMITH_TRACING": "false",
}


def dev_command(port: int) -> list[str]:
    """`langgraph dev` without a browser or a reload loop (the data folder changes every turn)."""
    binary = shutil.which("langgraph") or str(Path(sys.executable).with_name("langgraph"))
    return [
        binary,
        "dev",
        "--no-browser",
        "--no-reload",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(REPO / "langgraph.json"),
    ]


def dev_env(data: Path, group_reply: str | None = None) -> dict[str, str]:
    reply = {GROUP_REPLY_ENV: group_reply} if group_reply else {}
    return {**os.environ, **OFFLINE_ENV, DATA_ENV: str(Path(data).resolve()), **reply}


def serve(data: Path, port: int, group_reply: str | None = None) -> int:
    """Become the dev server (exec), so Ctrl-C and signals reach it directly."""
    if not (REPO / "langgraph.json").exists():
        print(
            f"cyrene studio needs the source checkout (no langgraph.json in {REPO})",
            file=sys.stderr,
        )
        return 2
    command = dev_command(port)
    print(f"API:    http://127.0.0.1:{port}  (docs at /docs)")
    print(
        f"Studio: https://smith.langchain.com/studio/?baseUrl=http://127.0.0.1:{port}", flush=True
    )
    os.chdir(REPO)
    os.execve(command[0], command, dev_env(data, group_reply))
    return 0  # not reached
