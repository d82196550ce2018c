"""Several worker processes on Postgres checkpoints and one Chroma server.

Four real worker processes (tests/workers_worker.py) share a Postgres
database and a `chroma run` server, with background extraction on. Ten
sessions × five turns: turn j of session k is sent by worker (k + j) mod 4,
each worker running its sessions side by side, so every session gets messages
from several processes at once and the session lock decides who runs a turn.
One worker is SIGKILLed inside a model call while an earlier turn's extraction
of its own is under way; another worker finishes its sessions and runs
`resume_extractions`. At the end every message is stored once and answered,
and every message's memory is in the store once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from langchain_core.messages import BaseMessage

from graph import LoopConfig, build_graph, open_checkpointer, resume_extractions
from memory import MemoryItem, MemoryStore
from tests.conftest import REPO
from tests.scripted import ScriptedChatModel
from tests.workers_worker import memory_text, message_id, thread_id

pytestmark = pytest.mark.slow

WORKERS, SESSIONS, TURNS = 4, 10, 5
VICTIM, HEIR = "w3", "w0"
HANG_AT = 2  # the victim's second model call never returns (under `merge` the other
# workers answer many of its messages, so it may make few calls of its own)


@pytest.fixture
def fresh_database(postgres_url: str) -> Iterator[str]:
    """A database of its own on the shared server: `resume_extractions` reads every
    session of its checkpointer, and other runs' sessions are none of this test's."""
    import psycopg

    name = f"cyrene_workers_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(postgres_url)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def start(spec: dict) -> subprocess.Popen:
    """A worker; its log goes to `<worker>.log` (a pipe nobody reads could fill and block it)."""
    path = Path(spec["dir"]) / f"{spec['worker']}.log"
    with path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.workers_worker", json.dumps(spec)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    LOGS[proc.pid] = path
    return proc


LOGS: dict[int, Path] = {}


def log_of(proc: subprocess.Popen) -> str:
    """The tail of a process's stderr: its log file, or its pipe."""
    if proc.pid in LOGS:
        return LOGS[proc.pid].read_text()[-3000:]
    return proc.communicate()[1][-3000:]


def until(path: Path, procs: list[subprocess.Popen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for proc in procs:
            assert proc.poll() is None, log_of(proc)
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def until_victim_is_stuck(folder: Path, victim: subprocess.Popen, timeout: float = 60) -> str:
    """Where the victim is when the parent kills it: inside its second model call, or — when
    the other workers answered the rest of its messages under `merge`, so no second call
    comes — inside its own background extraction, which never finishes. Either way an
    extraction of its own is claimed and not stored."""
    deadline = time.monotonic() + timeout
    extracting_since = None
    while time.monotonic() < deadline:
        assert victim.poll() is None, log_of(victim)
        if (folder / f"inside-{VICTIM}").exists():
            return f"its model call #{HANG_AT}"
        calls = folder / "calls.log"
        if (
            extracting_since is None
            and calls.exists()
            and f"\n{VICTIM} " in "\n" + calls.read_text()
        ):
            extracting_since = time.monotonic()
        if extracting_since is not None and time.monotonic() - extracting_since > 2:
            return "its background extraction"
        time.sleep(0.02)
    raise AssertionError(f"{VICTIM} never reached a kill point")


class NoExtractor:
    """For the final check: nothing may be left for it to run."""

    background = True

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        raise AssertionError("an extraction was still pending")


def story(folder: Path, missing: list[str], stats: list[dict]) -> str:
    """What the run did, for a failure's message: the memories missing, every extractor
    call, each worker's pipeline cycles (`cyrene.memory` at debug level) and counts."""
    calls = (folder / "calls.log").read_text() if (folder / "calls.log").exists() else ""
    logs = [
        line
        for name in sorted(folder.glob("w*.log"))
        for line in name.read_text().splitlines()
        if "cyrene" in line
    ]
    return "\n".join(
        [f"missing: {missing}", "extractor calls:", calls, "logs:", *sorted(logs), f"{stats}"]
    )


def lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_four_workers_one_killed_every_turn_and_memory_exactly_once(
    tmp_path, fresh_database, chroma_server
):
    tag = uuid.uuid4().hex[:8]
    persona = f"w{tag}"
    assignment: dict[str, list[list[int]]] = {f"w{n}": [] for n in range(WORKERS)}
    for session in range(SESSIONS):
        for turn in range(TURNS):
            assignment[f"w{(session + turn) % WORKERS}"].append([session, turn])
    common = {
        "dir": str(tmp_path),
        "url": fresh_database,
        "chroma_port": chroma_server,
        "persona": persona,
        "tag": tag,
        "delay": 0.05,
        "extract_delay": 0.02,
    }
    specs = {name: {**common, "worker": name, "turns": turns} for name, turns in assignment.items()}
    specs[VICTIM].update(hang_at=HANG_AT, extract_delay=600)  # its extractions never finish
    specs[HEIR]["takeover"] = True
    started = time.monotonic()
    procs = {name: start(spec) for name, spec in specs.items()}
    everyone = list(procs.values())
    try:
        for name in procs:
            until(tmp_path / f"ready-{name}", everyone)
        (tmp_path / "go").touch()
        where = until_victim_is_stuck(tmp_path, procs[VICTIM])
        os.kill(procs[VICTIM].pid, signal.SIGKILL)
        victim_out, _ = procs[VICTIM].communicate(timeout=10)
        assert procs[VICTIM].returncode == -signal.SIGKILL
        victim_calls = [
            line
            for line in (tmp_path / "calls.log").read_text().splitlines()
            if line.startswith(f"{VICTIM} ")
        ]
        (tmp_path / "takeover.json").write_text(json.dumps(assignment[VICTIM]))
        outputs = {}
        for name, proc in procs.items():
            if name != VICTIM:
                out, _ = proc.communicate(timeout=90)
                assert proc.returncode == 0, log_of(proc)
                outputs[name] = lines(out)
    finally:
        for proc in everyone:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    took = time.monotonic() - started

    sent = [r for out in outputs.values() for r in out if "id" in r]
    assert not [r for r in sent if "error" in r], "no survivor's call failed"
    assert all(r["answered"] for r in sent), "every call returns a state that answers it"
    takeover = next(r["takeover"] for r in outputs[HEIR] if "takeover" in r)
    stats = [r for out in outputs.values() for r in out if "stats" in r]
    assert all(s["drained"] for s in stats), stats
    assert not any(s["stats"]["lost"] for s in stats), f"no extraction is lost: {stats}"

    # Every message: stored exactly once, answered, nothing left interrupted.
    with open_checkpointer(fresh_database) as saver:
        graph = build_graph(LoopConfig(model=ScriptedChatModel()), saver)
        found_turns = 0
        for session in range(SESSIONS):
            state = graph.get_state({"configurable": {"thread_id": thread_id(tag, session)}})
            messages = state.values["messages"]
            humans = [m.id for m in messages if m.type == "human"]
            expected = [message_id(tag, session, turn) for turn in range(TURNS)]
            assert sorted(humans) == sorted(expected), f"session {session}: {humans}"
            assert messages[-1].type == "ai" and not state.next, f"session {session} is complete"
            found_turns += len(humans)

    # Every message's memory: in the store exactly once, and no extraction left pending.
    store = MemoryStore.connect("127.0.0.1", chroma_server)
    try:
        memories = [m.content for m in store.list(persona_id=persona)]
        with open_checkpointer(fresh_database) as saver:
            config = LoopConfig(model=ScriptedChatModel(), memory=store, extractor=NoExtractor())
            left = resume_extractions(config, saver)
    finally:
        store.close()
    assert left == 0, "a later start finds every extraction done"
    expected_memories = sorted(
        memory_text(message_id(tag, s, t)) for s in range(SESSIONS) for t in range(TURNS)
    )
    missing = sorted(set(expected_memories) - set(memories))
    assert sorted(memories) == expected_memories, story(tmp_path, missing, stats)

    victim_answered = [r for r in lines(victim_out) if r.get("answered")]
    print(
        f"turns: expected {SESSIONS * TURNS}, found {found_turns}; memories: expected "
        f"{len(expected_memories)}, found {len(memories)}; killed {VICTIM} inside {where} "
        f"after {len(victim_answered)} answered calls, with "
        f"{len(victim_calls)} extraction(s) of its own under way; takeover {takeover}; "
        f"extractor calls {len((tmp_path / 'calls.log').read_text().splitlines())}; "
        f"{took:.1f} s"
    )
    assert victim_calls, "the victim died with an extraction of its own under way"


OPEN_AT_ONCE = """
import asyncio, sys, time
from pathlib import Path
from graph import open_checkpointer
from graph.sessions import inbox_for
url, folder, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

async def aopen():
    async with open_checkpointer(url) as saver:
        inbox_for(saver)

(folder / f"ready-{mode}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
if mode.startswith("async"):
    asyncio.run(aopen())
else:
    with open_checkpointer(url) as saver:
        inbox_for(saver)
"""


def test_workers_starting_together_on_a_fresh_database_all_start(tmp_path, fresh_database):
    """LangGraph's `setup()` and the session tables' DDL race when workers first open a
    fresh database at the same moment (duplicate migration rows, a deadlock, a
    `pg_type` unique violation): each of four such processes must start."""
    modes = ("sync-0", "sync-1", "sync-2", "async-3")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, fresh_database, str(tmp_path), mode],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in modes
    ]
    try:
        for mode in modes:
            until(tmp_path / f"ready-{mode}", procs)
    finally:
        (tmp_path / "go").touch()
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(e[-1500:] for e in errors)
