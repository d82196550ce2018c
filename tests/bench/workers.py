"""Scaling out: turns per second with 1, 2 and 4 worker processes on one Postgres.

    python -m tests.bench.workers              # 15 s per configuration
    python -m tests.bench.workers --seconds 8

Each worker process opens the same Postgres database (`open_checkpointer`,
async saver), builds the loop with a model that answers after a 200 ms
`asyncio.sleep` (a hosted model's wait), and runs `SESSIONS_PER_WORKER`
sessions of its own side by side, turn after turn, for the measured window.
The window starts at one wall-clock moment for every worker, after each has
started and run a warm-up turn, so process start-up is not measured. Plain
text turns, no memory: this measures the loop, its checkpoints and the session
lock against the model's wait. The bench runs in a database of its own on the
server (`$CYRENE_POSTGRES_URL`, default the tests' one), dropped at the end.
`bench_worker_scaling` appends its rows to `tests.bench.run.ROWS`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from graph import LoopConfig, Persona, build_graph, open_checkpointer
from tests.scripted import ScriptedChatModel

MODEL_SECONDS = 0.2
SESSIONS_PER_WORKER = 8
PROCESS_COUNTS = (1, 2, 4)
POSTGRES_URL = os.environ.get("CYRENE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[2]


class SlowModel(ScriptedChatModel):
    """Answers "好的" after an `asyncio.sleep` of `MODEL_SECONDS`; keeps no script."""

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(MODEL_SECONDS)
        return ChatResult(generations=[ChatGeneration(message=AIMessage("好的"))])


# -- the worker process --------------------------------------------------------------------


async def work(spec: dict) -> dict:
    """Warm up, wait for the shared start, run turns until the window closes."""
    config = LoopConfig(model=SlowModel(), personas={"p": Persona()}, default_persona="p")
    name, tag = spec["worker"], spec["tag"]
    latencies: list[float] = []
    async with open_checkpointer(spec["url"]) as saver:
        graph = build_graph(config, saver)

        async def turn(session: int, n: int) -> None:
            await graph.ainvoke(
                {"messages": [HumanMessage(f"第{n}句")]},
                {"configurable": {"thread_id": f"{tag}-{name}-s{session}"}},
            )

        await turn(-1, 0)  # warm-up: imports, connections, tables
        Path(spec["dir"], f"ready-{name}").touch()
        go = Path(spec["dir"], "go")
        while not go.exists():
            await asyncio.sleep(0.01)
        start = float(go.read_text())
        end = start + spec["seconds"]
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu = time.process_time()

        async def session(number: int) -> None:
            n = 0
            while time.time() < end:
                began = time.time()
                await turn(number, n)
                if time.time() <= end:
                    latencies.append(time.time() - began)
                n += 1

        await asyncio.gather(*(session(k) for k in range(SESSIONS_PER_WORKER)))
        cpu = time.process_time() - cpu
    return {"turns": len(latencies), "latencies": latencies, "cpu": cpu}


def worker_main(spec_json: str) -> None:
    print(json.dumps(asyncio.run(work(json.loads(spec_json)))), flush=True)
    os._exit(0)


# -- the parent ------------------------------------------------------------------------------


@contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A database of its own on `url`'s server, dropped afterwards."""
    import psycopg

    name = f"cyrene_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@dataclass
class Measured:
    rate: float
    """Turns per second, all workers together."""
    p50_ms: float
    """Median turn latency."""
    cpu_ms: float
    """Worker CPU time per turn (the Postgres server's is not counted)."""


def measure(url: str, processes: int, seconds: float, folder: Path) -> Measured:
    """Throughput, latency and CPU cost of `processes` workers over one window."""
    folder.mkdir(parents=True)
    tag = uuid.uuid4().hex[:8]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.bench.workers",
                "--worker",
                json.dumps(
                    {
                        "worker": f"w{n}",
                        "tag": tag,
                        "url": url,
                        "dir": str(folder),
                        "seconds": seconds,
                    }
                ),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    deadline = time.monotonic() + 120
    while not all((folder / f"ready-w{n}").exists() for n in range(processes)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError("a bench worker did not start")
        time.sleep(0.05)
    (folder / "go").write_text(str(time.time() + 0.5))
    results = [json.loads(p.communicate(timeout=seconds + 120)[0].splitlines()[-1]) for p in procs]
    turns = sum(r["turns"] for r in results)
    latencies = [x for r in results for x in r["latencies"]]
    cpu = sum(r["cpu"] for r in results)
    return Measured(turns / seconds, statistics.median(latencies) * 1000, cpu / turns * 1000)


def bench_worker_scaling(seconds: float, folder: Path, url: str = POSTGRES_URL) -> None:
    from tests.bench.table import row

    measured: dict[int, Measured] = {}
    with fresh_database(url) as database:
        for processes in PROCESS_COUNTS:
            measured[processes] = measure(database, processes, seconds, folder / f"p{processes}")
    one = measured[1].rate
    ideal = SESSIONS_PER_WORKER / MODEL_SECONDS
    for processes, m in measured.items():
        name = (
            f"{processes} worker process{'es' if processes > 1 else ''} on Postgres, "
            f"{SESSIONS_PER_WORKER} sessions each, 200 ms model (turns/s)"
        )
        ours = f"{m.rate:.1f} (p50 {m.p50_ms:.0f} ms, {m.cpu_ms:.0f} ms CPU/turn)"
        if processes == 1:
            row(name, ours, f"model-bound {ideal:.0f}", m.rate / ideal, "reported")
        else:
            row(
                name, ours, f"1 process {one:.1f}", m.rate / one, f"scaling {processes}/1, reported"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    import tempfile

    from tests.bench.table import ROWS

    with tempfile.TemporaryDirectory() as tmp:
        bench_worker_scaling(args.seconds, Path(tmp))
    print("| benchmark | ours | peer | ratio | target |\n|---|---|---|---|---|")
    for cells in ROWS:
        print("| " + " | ".join(cells) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
