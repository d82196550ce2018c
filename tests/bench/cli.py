"""CLI start-up: how long `cyrene --help`, `history` and `sessions` take from a cold process.

    python -m tests.bench.cli            # 15 runs of each, docs/benchmarks.md rows
    python -m tests.bench.cli --quick    # 5 runs, to check that it runs

Each command runs as a user runs it, `python -m studio.cli.main …` in a fresh
interpreter, on a data folder of 5 demo-world sessions of 10 turns each (a
tool round in every session, so the checkpoints hold LangGraph `Send`s). The
peer is what every command paid before the front door was made lazy: a
fresh interpreter importing the loop and the demo world (`graph.builder`,
`studio.demo.world`: LangGraph, LangChain, chromadb). Each row gives the median
wall time and, in brackets, the median CPU time (user + system) of the
child, which a busy machine moves less.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from graph import SessionEnv, build_graph, open_checkpointer
from studio.demo.world import demo_config
from tests.bench.table import print_bench

Row = tuple[str, str, str, float | str, str]
REPO = Path(__file__).resolve().parents[2]
LINES = ("早上好", "现在几点了？", "今天有点累", "记住 周末去爬山", "晚安")


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh `python ARGV` in the repo."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(argv: list[str], runs: int) -> tuple[float, float]:
    samples = [timed(argv) for _ in range(runs)]
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def fill(data: Path, sessions: int = 5, turns: int = 10) -> None:
    """`sessions` demo-world sessions of `turns` owner turns each, on the demo model."""
    config = demo_config(data)
    try:
        with open_checkpointer(f"sqlite:///{data / 'checkpoints.db'}") as saver:
            graph = build_graph(config, saver)
            for s in range(sessions):
                for t in range(turns):
                    text = LINES[t % len(LINES)]
                    graph.invoke(
                        {"messages": [HumanMessage(text)]},
                        {"configurable": {"thread_id": f"s{s}"}},
                        context=SessionEnv(actor="owner"),
                    )
    finally:
        config.memory.close()  # type: ignore[union-attr]


def cell(wall: float, cpu: float) -> str:
    return f"{wall:.2f} ({cpu:.2f})"


def bench_cli(quick: bool) -> list[Row]:
    runs = 5 if quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        fill(data)
        peer = medians(["-c", "import graph.builder, studio.demo.world"], runs)
        cli = ["-m", "studio.cli.main", "--data", str(data)]
        help_ = medians([*cli, "--help"], runs)
        history = medians([*cli, "history", "s0"], runs)
        sessions = medians([*cli, "sessions"], runs)
    loop = f"loading the loop {cell(*peer)}"
    return [
        ("`cyrene --help`, cold process (s, CPU in brackets)", cell(*help_), loop,
         help_[0] / peer[0], "< 0.5 s"),
        ("`cyrene history` of a 10-turn session, cold (s)", cell(*history), loop,
         history[0] / peer[0], "< 1 s"),
        ("`cyrene sessions`, 5 sessions, cold (s)", cell(*sessions), loop,
         sessions[0] / peer[0], "< 1 s"),
    ]  # fmt: skip


def main(argv: Any = None) -> None:
    print_bench(bench_cli, argv)


if __name__ == "__main__":
    main()
