"""One turn at a time per session across processes: real worker processes on one
SQLite file or one Postgres database, under each policy, sync and async, and a
worker SIGKILLed in the middle of a merged turn."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from graph import LoopConfig, build_graph, open_checkpointer
from tests.conftest import REPO, thread
from tests.scripted import ScriptedChatModel

pytestmark = pytest.mark.slow


def url_for(kind: str, tmp_path: Path, request) -> str:
    if kind == "postgres":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path}/shared.db"


def start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.session_worker", json.dumps(spec)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def until(check, timeout: float = 60, procs: list[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for proc in procs:
            assert proc.poll() in (None, 0), proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def stored_humans(url: str, name: str) -> list[str]:
    with open_checkpointer(url) as saver:
        graph = build_graph(LoopConfig(model=ScriptedChatModel()), saver)
        return [m.id for m in graph.get_state(thread(name)).values["messages"] if m.type == "human"]


def waiting(url: str, name: str) -> int:
    """Calls queued on the session, read straight from the ledger's table."""
    query = "select count(*) from cyrene_session_inbox where thread_id = {} and status = 'waiting'"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return conn.execute(query.format("?"), (name,)).fetchone()[0]
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(query.format("%s"), (name,)).fetchone()[0]


POLICIES = ["merge", "enqueue", "reject"]


def databases(tmp_path: Path, request) -> dict[str, str]:
    """SQLite always; Postgres when there is one (CI requires it, see `postgres_url`)."""
    found = {"sqlite": f"sqlite:///{tmp_path}/shared.db"}
    try:
        found["postgres"] = request.getfixturevalue("postgres_url")
    except pytest.skip.Exception as skipped:
        print(f"Postgres rows skipped: {skipped}")
    return found


def test_three_processes_on_one_session_under_each_policy(tmp_path, request):
    """Three workers (two sync, one async) × two callers each, on one session per
    database and policy: every accepted message is stored once and answered; a
    rejected one never is."""
    tag = uuid.uuid4().hex[:8]
    scenarios = [
        {"url": url, "kind": kind, "policy": p, "thread": f"{tag}-{p}", "per_caller": 4}
        for kind, url in databases(tmp_path, request).items()
        for p in POLICIES
    ]
    workers = {
        name: start({"worker": name, "mode": mode, "dir": str(tmp_path), "scenarios": scenarios})
        for name, mode in (("w1", "sync"), ("w2", "sync"), ("w3", "async"))
    }
    procs = list(workers.values())
    until(lambda: all((tmp_path / f"ready-{w}").exists() for w in workers), procs=procs)
    for k in range(len(scenarios)):
        (tmp_path / f"go-{k}").touch()
        until(lambda k=k: all((tmp_path / f"done-{w}-{k}").exists() for w in workers), procs=procs)
    results = {}
    for name, proc in workers.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        results[name] = [json.loads(line) for line in out.splitlines()]

    for k, scenario in enumerate(scenarios):
        scores = [results[w][k] for w in workers]
        sent = sorted(i for s in scores for i in s["sent"])
        rejected = [i for s in scores for i in s["rejected"]]
        calls = sum(s["model_calls"] for s in scores)
        stored = stored_humans(scenario["url"], scenario["thread"])
        where = f"{scenario['kind']} {scenario['policy']}"
        print(
            f"{where}: sent {len(sent)}, stored {len(stored)}, rejected {len(rejected)}, "
            f"model calls {calls}"
        )
        assert sorted(stored) == sent, f"{where}: sent {len(sent)}, stored {len(stored)}"
        assert not any(s["unanswered"] for s in scores), "every caller's state answers its message"
        assert len(sent) + len(rejected) == 24
        if scenario["policy"] == "merge":
            assert calls < len(sent), "a burst from several processes is answered by fewer turns"
        if scenario["policy"] == "enqueue":
            assert calls == len(sent), "one turn per message"
        if scenario["policy"] == "reject":
            assert rejected and calls == len(sent)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_worker_killed_inside_a_merged_turn_blocks_nobody(kind, tmp_path, request):
    """Worker X runs a turn that merged worker Y's message, and is SIGKILLed in it.
    Y's caller takes the session over, resumes the interrupted turn and gets its
    answer; a message that was only waiting then gets a turn of its own."""
    url, name = url_for(kind, tmp_path, request), f"kill-{uuid.uuid4().hex[:8]}"
    common = {"url": url, "dir": str(tmp_path)}
    x = start(
        {
            **common,
            "worker": "x",
            "mode": "sync",
            "hold": [1],
            "hang": [2],
            "sends": [
                {"id": "x1", "thread": name},
                {"id": "x2", "thread": name, "after": "send-x2"},
            ],
        }
    )
    y = start(
        {
            **common,
            "worker": "y",
            "mode": "async",
            "sends": [
                {"id": "y1", "thread": name, "after": "send-y1"},
                {"id": "y2", "thread": name, "after": "send-y2"},
            ],
        }
    )
    until(lambda: (tmp_path / "calling-x-1").exists(), procs=[x, y])
    (tmp_path / "send-x2").touch()
    until(lambda: waiting(url, name) == 1, procs=[x, y])
    until(lambda: (tmp_path / "ready-y").exists(), procs=[x, y])
    (tmp_path / "send-y1").touch()
    until(lambda: waiting(url, name) == 2, procs=[x, y])
    (tmp_path / "release-1").touch()  # x1's turn ends; x2's turn takes y1 along, and hangs
    until(lambda: (tmp_path / "calling-x-2").exists(), procs=[x, y])
    (tmp_path / "send-y2").touch()
    until(lambda: waiting(url, name) == 1, procs=[x, y])
    killed = time.monotonic()
    os.kill(x.pid, signal.SIGKILL)
    x.wait(10)
    out, err = y.communicate(timeout=60)
    took = time.monotonic() - killed
    assert y.returncode == 0, err[-3000:]
    results = {r["id"]: r for r in map(json.loads, out.splitlines())}
    assert results["y1"].get("answered"), results
    assert results["y2"].get("answered"), results
    assert took < 15, f"the dead worker held the session for {took:.1f} s"
    assert stored_humans(url, name) == ["x1", "x2", "y1", "y2"], "each stored once, in order"
