"""Instructions per turn, counted by callgrind: what a turn costs whatever else the machine runs.

    python -m tests.bench.instructions                     # every case, under callgrind
    python -m tests.bench.instructions load-ours --turns 40  # one case
    python -m tests.bench.instructions --native lock-memory-async-on  # CPU ms, no callgrind

Each case runs in a process of its own under `valgrind --tool=callgrind`, with
instrumentation off until its graph is built and warmed up; then only its
measured turns are counted (collection is toggled around them, so a case's
untimed heap collections between turns are not). The setups are
`tests.bench.traffic`'s:

- `lock-SAVER-MODE-on|off`: single turns on new threads, a zero-latency model,
  the session lock on or off (`traffic.lock_variants`), automatic garbage
  collection off and the heap collected every 50 turns, uncounted (as the lock
  rows run them);
- `load-ours|peer`: 10 sessions at once on one event loop, each sending turns
  back to back (`traffic.turn_rate`), ours or `create_agent`, in-memory savers,
  a zero-latency model, garbage collection on (both sides pay their own).

A small C helper (callgrind's client requests, built with `cc` on first use)
switches the counting on and off; `--native` reports CPU ms per turn instead.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from graph import open_checkpointer
from tests.bench.traffic import SleepyModel, lock_variants, ours, turn_input

HELPER_SOURCE = """
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; }
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void dump(void) { CALLGRIND_DUMP_STATS; }
"""
LOCK_CASES = [
    f"lock-{saver}-{mode}-{lock}"
    for saver in ("memory", "sqlite")
    for mode in ("sync", "async")
    for lock in ("on", "off")
]
CASES = [*LOCK_CASES, "load-ours", "load-peer"]
WARM_UP = 30
COLLECT_EVERY = 50
LOAD_SESSIONS = 10


class Counter:
    """Counts the measured turns: callgrind's collection, or CPU time when run natively."""

    def __init__(self, native: bool) -> None:
        self.cpu = 0.0
        self._helper: Any = None if native else _helper()

    def start(self) -> None:
        """Instrumentation on (after the set-up, which it would slow fiftyfold)."""
        if self._helper is not None:
            self._helper.start()

    @contextmanager
    def counting(self, counted: bool = True) -> Iterator[None]:
        if not counted:
            yield
            return
        if self._helper is not None:
            self._helper.toggle()
        started = time.process_time()
        try:
            yield
        finally:
            self.cpu += time.process_time() - started
            if self._helper is not None:
                self._helper.toggle()

    def finish(self) -> None:
        if self._helper is not None:
            self._helper.dump()


def _helper() -> Any:
    folder = Path(tempfile.mkdtemp(prefix="cyrene-callgrind-"))
    (folder / "helper.c").write_text(HELPER_SOURCE)
    library = folder / "helper.so"
    subprocess.run(
        ["cc", "-O1", "-shared", "-fPIC", "-o", library, folder / "helper.c"], check=True
    )
    return ctypes.CDLL(str(library))


def lock_case(saver: str, mode: str, lock: str, turns: int, counter: Counter) -> None:
    """Single turns on new threads, as `traffic.lock_overhead` runs them, one column only."""
    with tempfile.TemporaryDirectory() as folder:
        url = "memory" if saver == "memory" else f"sqlite:///{folder}/lock.db"
        if mode == "async":
            asyncio.run(_alock_case(url, lock, turns, counter))
            return
        with open_checkpointer(url) as checkpointer:
            graph = lock_variants(ours(SleepyModel(latency=0), checkpointer))[lock]
            for i, counted in schedule(turns, counter):
                with counter.counting(counted):
                    graph.invoke(*turn_input(lock, i))


async def _alock_case(url: str, lock: str, turns: int, counter: Counter) -> None:
    async with open_checkpointer(url) as checkpointer:
        graph = lock_variants(ours(SleepyModel(latency=0), checkpointer))[lock]
        for i, counted in schedule(turns, counter):
            with counter.counting(counted):
                await graph.ainvoke(*turn_input(lock, i))


def schedule(turns: int, counter: Counter) -> Iterator[tuple[int, bool]]:
    """(turn, counted): the warm-up turns, then the counted ones with automatic garbage
    collection off and the heap collected every `COLLECT_EVERY` turns, uncounted."""
    yield from ((i, False) for i in range(WARM_UP))
    counter.start()
    gc.disable()
    try:
        for i in range(WARM_UP, WARM_UP + turns):
            if i % COLLECT_EVERY == 0:
                gc.collect()
            yield i, True
    finally:
        gc.enable()


async def load_case(side: str, turns: int, counter: Counter) -> None:
    """`LOAD_SESSIONS` sessions sending `turns` turns each, back to back, on one event loop."""
    async with open_checkpointer("memory") as checkpointer:
        if side == "ours":
            graph = ours(SleepyModel(latency=0), checkpointer)
        else:
            graph = create_agent(
                SleepyModel(latency=0), tools=[], system_prompt="你是P。", checkpointer=checkpointer
            )

        def sessions(tag: str, count: int) -> Awaitable[Any]:
            async def session(i: int) -> None:
                for n in range(count):
                    await graph.ainvoke(
                        {"messages": [HumanMessage(f"第{n}句")]},
                        {"configurable": {"thread_id": f"{tag}-{i}"}},
                    )

            return asyncio.gather(*(session(i) for i in range(LOAD_SESSIONS)))

        await sessions("warm", 3)
        counter.start()
        with counter.counting():
            await sessions("load", turns)


def run_case(case: str, turns: int, native: bool) -> float:
    """Instructions (or CPU ms, `native`) per turn of one case, run in this process."""
    counter = Counter(native)
    kind, *rest = case.split("-")
    if kind == "lock":
        lock_case(*rest, turns, counter)
        count = turns
    else:
        asyncio.run(load_case(rest[0], turns, counter))
        count = turns * LOAD_SESSIONS
    counter.finish()
    return counter.cpu / count * 1000


def counted(case: str, turns: int) -> float:
    """Instructions per turn of `case`, run in a child process under callgrind."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--collect-atstart=no",
                f"--callgrind-out-file={out}.%p",
                sys.executable,
                "-m",
                "tests.bench.instructions",
                "--child",
                case,
                "--turns",
                str(turns),
            ],
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stderr=subprocess.DEVNULL,
        )
        dumps = sorted(Path(folder).glob("callgrind.out.*"))
        totals = [_total(d) for d in dumps]
        measured = max(totals)  # the explicit dump; the one at exit holds what came after
    per_turn_count = turns * (LOAD_SESSIONS if case.startswith("load") else 1)
    return measured / per_turn_count


def _total(dump: Path) -> int:
    match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", metavar="case", help=" ".join(CASES))
    parser.add_argument("--turns", type=int, default=0, help="measured turns (per session)")
    parser.add_argument("--native", action="store_true", help="CPU ms per turn, no callgrind")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if unknown := set(args.cases) - set(CASES):
        parser.error(f"unknown cases: {sorted(unknown)}")
    for case in args.cases or CASES:
        turns = args.turns or (20 if case.startswith("load") else 200)
        if args.child:
            run_case(case, turns, native=False)
        elif args.native:
            print(f"{case}: {run_case(case, turns, native=True):.2f} CPU ms per turn")
        else:
            print(f"{case}: {counted(case, turns) / 1e6:.3f} M instructions per turn", flush=True)


if __name__ == "__main__":
    main()
