"""The crash matrix: a real SIGKILL at every node boundary, after the final reply, and inside
the model call, a tool call and a background extraction, on SQLite and on Postgres; a new
process then recovers.

After recovery, in every trial: the turn completes, the user's message is stored exactly
once, no tool call that finished runs again, no tool call is left unanswered, and the
turn's memory is stored exactly once (its pending extraction ran once in effect).

A user does not know that a process died: the next message may come instead of a resume.
Then both messages are stored and answered, and each one's memory is stored exactly once
(the dead turn's extraction is not dropped with the rest of that turn).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from nodes.core.stages import LOOP_NODES
from tests.conftest import REPO

pytestmark = [pytest.mark.slow]

# The worker's config switches every stage on, so every node has a boundary to die at.
POINTS = (*(f"node:{n}" for n in LOOP_NODES), "reply", "model", "tool", "extraction")


def run_worker(
    url: str, data: Path, point: str, mode: str, thread: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.crash_matrix_worker", url, str(data), point, mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "CRASH_THREAD": thread},
        capture_output=True,
        text=True,
        timeout=120,
    )


def events(data: Path) -> list[str]:
    log = data / "events.log"
    return log.read_text().splitlines() if log.exists() else []


def crash_and_recover(url: str, data: Path, point: str, mode: str = "recover") -> dict:
    thread = f"matrix-{uuid.uuid4().hex[:10]}"
    crashed = run_worker(url, data, point, "start", thread)
    assert crashed.returncode == -signal.SIGKILL, (
        f"the worker was to die at {point}:\n{crashed.stdout}{crashed.stderr[-3000:]}"
    )
    assert f"kill {point}" in events(data)
    recovered = run_worker(url, data, point, mode, thread)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    return json.loads((data / "report.json").read_text())


def check_recovered(report: dict, log: list[str], point: str) -> None:
    assert report["final"] == "查好了：value of a，value of b", "the turn completes"
    assert report["user_messages"] == ["u1"], "the user's message is stored exactly once"
    assert report["unanswered"] == [], "no tool call is left without a result"
    assert report["kinds"] == ["human", "ai", "tool", "tool", "ai"]
    # Only what was running at the kill runs again; nothing that had finished does.
    assert log.count("tool start a") == 1, "the first call finished, then ran again"
    assert log.count("tool start b") == (2 if point == "tool" else 1)
    assert log.count("extract") == (2 if point == "extraction" else 1), (
        "a finished extraction is never run again; an interrupted one runs once more"
    )
    assert report["memories"] == 1, "the turn's memory is stored exactly once"


def check_next_message(report: dict, log: list[str], point: str) -> None:
    assert report["user_messages"] == ["u1", "u2"], "both messages are stored, once each"
    assert report["final"] == "好的，记住了", "the next message is answered"
    assert report["unanswered"] == [], "no tool call is left without a result"
    assert log.count("tool start a") <= 1, "a finished tool call never runs again"
    assert (report["memories"], report["next_memories"]) == (1, 1), (
        "each message's memory is stored exactly once"
    )


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_on_sqlite(tmp_path, point):
    report = crash_and_recover(f"sqlite:///{tmp_path / 'checkpoints.db'}", tmp_path, point)
    check_recovered(report, events(tmp_path), point)


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_then_the_next_message_on_sqlite(tmp_path, point):
    """The crashed turn is not resumed: the owner's next message arrives instead."""
    report = crash_and_recover(f"sqlite:///{tmp_path / 'checkpoints.db'}", tmp_path, point, "next")
    check_next_message(report, events(tmp_path), point)


@pytest.mark.parametrize(
    "point", ["reply", "node:extract_memory", "node:finish_turn", "extraction"]
)
def test_sigkill_after_the_reply_then_only_a_restart_on_sqlite(tmp_path, point):
    """The session never speaks again and nobody resumes it: a restart alone stores the
    memory of a turn that got its reply, once."""
    report = crash_and_recover(
        f"sqlite:///{tmp_path / 'checkpoints.db'}", tmp_path, point, "restart"
    )
    assert report["user_messages"] == ["u1"]
    assert report["memories"] == 1, "the answered turn's memory is stored exactly once"


@pytest.mark.services
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_on_postgres(tmp_path, fresh_postgres_url, point):
    report = crash_and_recover(fresh_postgres_url, tmp_path, point)
    check_recovered(report, events(tmp_path), point)
