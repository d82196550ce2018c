"""Exactly once, for real: a worker SIGKILLed after its reply, then recoverers racing.

Each trial: a worker process answers "记住 我喜欢乌龙茶" on a session of its
own and is SIGKILLed at a random moment 0-400 ms after `invoke` returned,
while its background extraction is queued, running, writing, or done. Its
store hears of a finished write up to 300 ms late (tests/exactly_once_worker.py),
so some kills land after the memory is on the server and before the extraction
is marked done. Then two or three recoverer processes call `resume_extractions`
at the same moment. The extractor words the fact differently on every call
(its pid and a counter), as a model would, so a second run cannot hide as an
upsert of the same text. After each trial the session has exactly one memory,
and the recoverers ran the extractor at most once in all, and not at all when
the ledger already said done.

Checkpoints are SQLite files (a recoverer scans every session of its file) or
one Postgres database (a recoverer scans its trial's session); memory and the
extraction ledger are on one `chroma run` server, the module's own. The
processes are forked from one warm parent, and several trials run at once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from chromadb.errors import NotFoundError

from graph import open_checkpointer
from memory import HashingEmbedding, MemoryStore
from nodes.extraction.ledger import ChromaExtractionLedger
from nodes.kernel.lease import pid_running
from tests.conftest import REPO, chroma_run, free_port

pytestmark = [pytest.mark.slow, pytest.mark.services]

TRIALS = 30
AT_ONCE = 5
KILL_WITHIN = 0.4


class Forker:
    """The warm parent (tests/exactly_once_worker.py): one spec in, one child pid out."""

    def __init__(self, log: Path) -> None:
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.exactly_once_worker"],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.lock = threading.Lock()
        assert self.proc.stdout is not None
        assert "ready" in json.loads(self.proc.stdout.readline())

    def start(self, **spec: object) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
            return int(json.loads(self.proc.stdout.readline())["pid"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def own_chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A `chroma run` server for this module alone: its hundreds of tea memories must not
    meet other tests' searches on the session's server."""
    port = free_port()
    with chroma_run(tmp_path_factory.mktemp("exactly-once-chroma"), port):
        yield port


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    started = Forker(tmp_path_factory.mktemp("forker") / "forker.log")
    yield started
    started.close()


def wait_for_file(path: Path, timeout: float, why: str) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        log = path.with_suffix(".log")
        assert time.monotonic() < deadline, (
            f"{why}: {log.read_text()[-2000:] if log.exists() else ''}"
        )
        time.sleep(0.01)
    return json.loads(path.read_text())


@dataclass
class Trial:
    """What one trial saw."""

    phase: str
    """Where the kill landed: before the claim, claimed, stored but not marked, or done."""
    memories: list[str]
    recoverers: int
    recoverer_runs: int
    """Extractor calls made by the recoverers."""
    resubmitted: list[int]
    lost: int
    final: str


def memories_of(store: MemoryStore, thread: str) -> list[str]:
    try:
        shared = store.client.get_collection("user")
    except (NotFoundError, ValueError):
        return []
    got = shared.get(where={"source_session_id": thread}, include=["documents"])
    return sorted(store._documents.unseal(got["ids"], got["documents"] or []))  # sealed text


def extractor_calls(trial: Path) -> list[str]:
    log = trial / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def settle_after_death(pid: int) -> None:
    """Wait until a killed process is gone, and then a little longer: a request it had
    sent before the signal (a done mark, a write) may still land on the server."""
    deadline = time.monotonic() + 10
    while pid_running(pid):
        assert time.monotonic() < deadline, f"{pid} outlived its SIGKILL"
        time.sleep(0.01)
    time.sleep(0.3)


def phase_of(store: MemoryStore, key: str, thread: str) -> str:
    record = ChromaExtractionLedger(store.client).read([key]).get(key)
    if record is None:
        return "before its claim"
    if record.state == "done":
        return "marked done"
    return "stored, not marked" if memories_of(store, thread) else "claimed, not stored"


def run_trial(
    forker: Forker, store: MemoryStore, folder: Path, port: int, url: str, tag: str, n: int
) -> Trial:
    thread = f"eo-{tag}-{n}"
    trial = folder / f"trial-{n}"
    trial.mkdir()
    url = url or f"sqlite:///{trial / 'checkpoints.db'}"
    common = {"dir": str(trial), "url": url, "port": port, "thread": thread}
    victim = forker.start(role="turn", name="turn", **common)
    key = wait_for_file(trial / "replied.json", 60, "the turn never replied")["key"]
    time.sleep(random.uniform(0, KILL_WITHIN))
    os.kill(victim, signal.SIGKILL)  # it waits for this, even once its extraction settled
    settle_after_death(victim)
    phase = phase_of(store, key, thread)
    before = extractor_calls(trial)
    count = random.choice([2, 3])
    at = time.time() + 0.4
    for r in range(count):
        threads = None if url.startswith("sqlite") else [thread]
        forker.start(role="recover", name=f"recover-{r}", threads=threads, at=at, **common)
    results = [
        wait_for_file(trial / f"recover-{r}.json", 90, f"recoverer {r}") for r in range(count)
    ]
    after = extractor_calls(trial)
    final = ChromaExtractionLedger(store.client).read([key]).get(key)
    return Trial(
        phase=phase,
        memories=memories_of(store, thread),
        recoverers=count,
        recoverer_runs=len(after) - len(before),
        resubmitted=[r["resubmitted"] for r in results],
        lost=sum(r["stats"]["lost"] for r in results),
        final=final.state if final else "none",
    )


@pytest.fixture(params=["sqlite", "postgres"])
def checkpoints(request: pytest.FixtureRequest) -> str:
    """The checkpoint URL: empty for a SQLite file per trial, else one fresh Postgres
    database for every trial."""
    if request.param == "sqlite":
        return ""
    url = request.getfixturevalue("fresh_postgres_url")
    with open_checkpointer(url):
        pass  # create the tables once, before thirty workers open the database at once
    return url


def test_racing_recoverers_after_a_sigkill_store_each_memory_exactly_once(
    forker: Forker, own_chroma: int, checkpoints: str, tmp_path: Path
) -> None:
    store = MemoryStore.connect("127.0.0.1", own_chroma, HashingEmbedding())
    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    with ThreadPoolExecutor(AT_ONCE) as pool:
        trials = list(
            pool.map(
                lambda n: run_trial(forker, store, tmp_path, own_chroma, checkpoints, tag, n),
                range(TRIALS),
            )
        )
    took = time.monotonic() - started
    duplicates = sum(max(0, len(t.memories) - 1) for t in trials)
    missing = sum(1 for t in trials if not t.memories)
    after_done = sum(t.recoverer_runs for t in trials if t.phase == "marked done")
    extra = sum(max(0, t.recoverer_runs - (t.phase != "marked done")) for t in trials)
    phases = Counter(t.phase for t in trials)
    contested = sum(1 for t in trials if sum(t.resubmitted) >= 2)
    print(
        f"{len(trials)} trials in {took:.1f} s; kills landed {dict(phases)}; "
        f"recoverers {Counter(t.recoverers for t in trials)}, several holding the work at once "
        f"in {contested}; recoverer runs {sum(t.recoverer_runs for t in trials)}; "
        f"duplicates {duplicates}, "
        f"missing {missing}, runs after a done mark {after_done}, runs beyond the one needed {extra}"
    )
    for t in trials:
        assert len(t.memories) == 1, t
        # At most one run; none once done. Zero runs is right too when the killed worker's
        # done mark was still on its way to the server as the phase was read.
        assert t.recoverer_runs <= (0 if t.phase == "marked done" else 1), t
        assert t.final == "done" and t.lost == 0, t
    assert duplicates == missing == after_done == extra == 0
    # The recoverers had work: kills that left the extraction unfinished, taken up by
    # several recoverers at once. (Few of them call the extractor: once the killed
    # worker recorded its plan, a recoverer applies that instead.)
    unfinished = sum(1 for t in trials if t.phase != "marked done")
    assert unfinished >= TRIALS // 3 and contested >= TRIALS // 3, "the recoverers had work"


@pytest.fixture(params=["sqlite", "chroma"])
def ledger_port(request: pytest.FixtureRequest) -> int:
    """0 for the SQLite ledger of an embedded store, else the Chroma server's port."""
    return 0 if request.param == "sqlite" else int(request.getfixturevalue("own_chroma"))


def test_of_processes_racing_for_one_claim_exactly_one_wins(
    forker: Forker, ledger_port: int, tmp_path: Path
) -> None:
    """Four processes swap 100 keys one by one, in the same order, from the same moment:
    first from no record, then each from the record it read (a slow one may read a
    record another already replaced: its swap must fail, or succeed from the newer one)."""
    keys = [f"race-{uuid.uuid4().hex[:8]}-{n}" for n in range(100)]
    at = time.time() + 1.0
    names = [f"swap-{n}" for n in range(4)]
    for name in names:
        forker.start(role="swap", name=name, dir=str(tmp_path), keys=keys, port=ledger_port, at=at)
    results = [wait_for_file(tmp_path / f"{name}.json", 60, name)["rounds"] for name in names]
    first = Counter(tuple(won) for rounds in results for won in rounds[0])
    second = Counter(tuple(won) for rounds in results for won in rounds[1])
    print(
        f"first round won by {[len(r[0]) for r in results]}, second by {[len(r[1]) for r in results]}"
    )
    assert sorted(first) == sorted((key, 0) for key in keys), "every key, from no record"
    assert set(first.values()) == {1}, "exactly one process claims a free key"
    assert set(second.values()) == {1}, "of those that swap the same record, one succeeds"
    assert {key for key, _ in second} == set(keys)


def test_a_rerun_applies_the_recorded_plan_instead_of_extracting_again(
    forker: Forker, own_chroma: int, tmp_path: Path
) -> None:
    """The worker's two memories are on the server, unmarked, when it is killed; its plan
    was recorded before they were written, so the recovery applies that plan again and
    never asks the extractor (which would now find one fact, worded its own way)."""
    store = MemoryStore.connect("127.0.0.1", own_chroma, HashingEmbedding())
    thread = f"fewer-{uuid.uuid4().hex[:8]}"
    common = {
        "dir": str(tmp_path),
        "url": f"sqlite:///{tmp_path / 'checkpoints.db'}",
        "port": own_chroma,
        "thread": thread,
    }
    victim = forker.start(role="turn", name="turn", items=2, ack=60, **common)
    wait_for_file(tmp_path / "replied.json", 60, "the turn never replied")
    deadline = time.monotonic() + 30
    while not (tmp_path / "stored").exists():
        assert time.monotonic() < deadline, (tmp_path / "turn.log").read_text()
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    settle_after_death(victim)
    earlier = memories_of(store, thread)
    assert len(earlier) == 2, "both of the killed run's memories landed"
    forker.start(role="recover", name="recover", items=1, threads=None, at=0, **common)
    result = wait_for_file(tmp_path / "recover.json", 60, "the recoverer")
    assert (tmp_path / "calls.log").read_text().splitlines()[1:] == [], "not extracted again"
    assert result["stats"]["succeeded"] == 1
    assert memories_of(store, thread) == earlier
