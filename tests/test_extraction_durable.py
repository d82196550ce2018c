"""Durable background extraction: a turn's extraction survives SIGKILL and runs exactly once.

Crash tests run the loop in real subprocesses (tests/extraction_crash_worker.py)
on SQLite checkpoints and an embedded Chroma store, and kill them with SIGKILL
once `invoke` has returned while the extraction is still running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

REMEMBERED = "记住 我喜欢乌龙茶"


def worker(data: Path, mode: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.extraction_crash_worker", str(data), mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(data: Path, mode: str, **env: str) -> dict:
    """Run a worker to the end: what it printed, parsed."""
    proc = worker(data, mode, **env)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output
    lines = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
    return {
        "memories": json.loads(lines["memories"]),
        "stats": json.loads(lines["stats"]),
        "output": output,
    }


def logged(data: Path) -> list[str]:
    log = data / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def calls(data: Path) -> list[str]:
    """The extractor's calls (the store's `apply` lines aside)."""
    return [line for line in logged(data) if line.startswith("call ")]


def kill_mid_extraction(data: Path, **env: str) -> None:
    """A turn returns its reply; its background extraction has started; SIGKILL."""
    proc = worker(data, "turn", EXTRACT_SECONDS="60", **env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "replied"
        deadline = time.monotonic() + 30
        while not calls(data) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert calls(data) == [f"call {REMEMBERED}"], "the extraction is running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


@pytest.mark.slow
def test_the_next_turn_runs_the_extraction_a_crash_interrupted(tmp_path):
    kill_mid_extraction(tmp_path)
    after = finish(tmp_path, "next")
    assert after["memories"] == ["我喜欢乌龙茶"], after["output"]
    assert sorted(calls(tmp_path)) == sorted(
        [f"call {REMEMBERED}", f"call {REMEMBERED}", "call 今天天气不错"]
    ), "the killed call, its rerun on the next turn, and the next turn's own"
    again = finish(tmp_path, "recover")
    assert again["memories"] == ["我喜欢乌龙茶"]
    assert len(calls(tmp_path)) == 3, "a finished extraction is not run again"


@pytest.fixture(params=["sqlite-sync", "sqlite-async", "postgres-sync"])
def saver(request, tmp_path) -> tuple[str, dict[str, str]]:
    """How the restarted worker recovers: its `resume_extractions` flavour and its saver."""
    if request.param.startswith("sqlite"):
        return ("arecover" if request.param.endswith("async") else "recover"), {}
    url = request.getfixturevalue("postgres_url")
    return "recover", {"CHECKPOINTS": url, "THREAD": f"extract-{uuid.uuid4().hex}"}


@pytest.mark.slow
def test_resume_extractions_at_start_runs_it_exactly_once(tmp_path, saver):
    mode, env = saver
    kill_mid_extraction(tmp_path, **env)
    after = finish(tmp_path, mode, **env)
    assert "resubmitted 1" in after["output"]
    assert after["memories"] == ["我喜欢乌龙茶"], after["output"]
    assert after["stats"]["succeeded"] == 1
    assert calls(tmp_path) == [f"call {REMEMBERED}"] * 2
    again = finish(tmp_path, mode, **env)
    assert "resubmitted 0" in again["output"], "the ledger says it is done"
    assert again["memories"] == ["我喜欢乌龙茶"]
    assert len(calls(tmp_path)) == 2


@pytest.mark.slow
def test_a_finished_extraction_is_not_run_again_after_restart(tmp_path):
    first = finish(tmp_path, "turn")
    assert first["memories"] == ["我喜欢乌龙茶"]
    # The turn's checkpoint still lists it (no later turn pruned it); the ledger says done.
    assert "resubmitted 0" in finish(tmp_path, "recover")["output"]
    after = finish(tmp_path, "next")
    assert after["stats"]["skipped"] == 1, "handed over again on the next turn, and skipped"
    assert sorted(calls(tmp_path)) == sorted([f"call {REMEMBERED}", "call 今天天气不错"])
    assert after["memories"] == ["我喜欢乌龙茶"]


@pytest.mark.slow
def test_a_failing_extraction_stops_after_three_attempts_and_counts_the_loss(tmp_path):
    first = finish(tmp_path, "turn", EXTRACT_FAIL="1")
    assert calls(tmp_path) == [f"call {REMEMBERED}"] * 3
    assert first["stats"]["lost"] == 1 and first["stats"]["retried"] == 2
    assert "failed 3 times; its memories are lost" in first["output"]
    after = finish(tmp_path, "recover", EXTRACT_FAIL="1")
    assert "resubmitted 0" in after["output"], "a lost extraction is not retried after restart"
    assert len(calls(tmp_path)) == 3
    assert first["memories"] == after["memories"] == []


@pytest.mark.slow
def test_a_forget_cut_off_by_a_crash_is_replayed_from_its_plan_and_stays_forgotten(tmp_path):
    """The owner says "忘掉乌龙茶"; the extraction has decided (its plan is in the ledger) and
    the store is about to apply it when the process is killed. The restart applies the
    recorded plan without asking the extractor again, and nothing brings the memory back."""
    assert finish(tmp_path, "turn")["memories"] == ["我喜欢乌龙茶"]
    proc = worker(tmp_path, "forget", APPLY_SECONDS="60")
    try:
        deadline = time.monotonic() + 60
        while logged(tmp_path).count("apply") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logged(tmp_path).count("apply") == 2, "the forget is being applied"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    after = finish(tmp_path, "recover")
    assert "resubmitted 1" in after["output"]
    assert after["memories"] == [], after["output"]
    assert calls(tmp_path) == [f"call {REMEMBERED}", "call 忘掉乌龙茶"], "replayed, not re-asked"
    again = finish(tmp_path, "recover")
    assert "resubmitted 0" in again["output"] and again["memories"] == []
