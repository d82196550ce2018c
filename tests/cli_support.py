"""Running `cyrene` in tests: in-process (`main([...])`, fast) or as a real subprocess."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from langchain_core.language_models import BaseChatModel

from studio.cli.main import main
from tests.conftest import REPO

# Root ignores file modes; a child without these capabilities sees them as a user does.
UNPRIVILEGED = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
)


def unprivileged() -> list[str]:
    """The command prefix that makes file modes bind (skips when root cannot shed them)."""
    if UNPRIVILEGED and shutil.which("setpriv") is None:
        pytest.skip("running as root without `setpriv` (util-linux): file modes do not bind")
    return UNPRIVILEGED


@dataclass
class Outcome:
    code: int
    out: str
    err: str


def cyrene(
    capsys: pytest.CaptureFixture[str],
    *argv: str,
    model: BaseChatModel | None = None,
    stdin: Any = None,
) -> Outcome:
    """`cyrene ARGV` in this process, offline (no $CYRENE_MODEL), with stdin if given."""
    capsys.readouterr()
    stdin = io.StringIO(stdin) if isinstance(stdin, str) else stdin
    with mock.patch.dict(os.environ), mock.patch.object(sys, "stdin", stdin or sys.stdin):
        os.environ.pop("CYRENE_MODEL", None)
        code = main(list(argv), model=model)
    out = capsys.readouterr()
    return Outcome(code, out.out, out.err)


def chat(
    capsys: pytest.CaptureFixture[str],
    data: Any,
    session: str,
    typed: str,
    model: BaseChatModel | None = None,
) -> Outcome:
    """`cyrene chat --session SESSION --data DATA`, with `typed` as what the user types."""
    return cyrene(
        capsys, "chat", "--session", session, "--data", str(data), model=model, stdin=typed
    )


def cyrene_process(
    *argv: str, stdin: str | None = None, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`python -m studio.cli.main ARGV` as a user runs it (offline)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CYRENE_MODEL", None)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "studio.cli.main", *argv],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(outcome: Outcome | subprocess.CompletedProcess[str]) -> str:
    """The single `cyrene: …` line an expected failure prints (asserting there is just one)."""
    err = outcome.err if isinstance(outcome, Outcome) else outcome.stderr
    lines = [line for line in err.splitlines() if line and "演示模型" not in line]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("cyrene: "), err
    return lines[0]
