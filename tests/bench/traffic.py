"""Real traffic on one process: what the session lock costs, turns per second under
load against `create_agent`, and what `merge` saves on a group burst.

    python -m tests.bench.traffic            # the three benchmarks, as docs/benchmarks.md rows
    python -m tests.bench.traffic --quick    # shorter runs, to check that it runs

- Lock overhead: the same zero-latency turn (a new thread each time, so the
  transcript stays short) with the session lock on and off, in alternating
  pairs of single turns, on the in-memory saver and on SQLite.
- Load: 50 sessions at once on one event loop, each sending plain text turns
  back to back for `seconds`, to a model that answers after 200 ms of
  `asyncio.sleep`; ours and `create_agent` on an in-memory saver each, one run
  of each in turn so machine drift hits both alike. Turns per second counts
  finished `ainvoke`s; CPU per turn is the process's CPU time over them.
- Burst: one turn is running when five group members write; model calls
  until all six are answered, under `merge` and under `enqueue`.

`bench_traffic(quick)` returns the rows for `tests/bench/run.py`'s `row`.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from graph import LoopConfig, Persona, SessionEnv, Sessions, build_graph, open_checkpointer
from graph.sessions import queued
from tests.bench.table import print_bench

Row = tuple[str, str, str, float | str, str]
PERSONAS = {"p": Persona(name="P", instructions="你是P。")}
REPLY = "嗯，我在听。"


class SleepyModel(BaseChatModel):
    """Answers after `latency` seconds (`asyncio.sleep` on the async path)."""

    latency: float = 0.2

    @property
    def _llm_type(self) -> str:
        return "sleepy"

    def _result(self) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(REPLY))])

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        time.sleep(self.latency)
        return self._result()

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(self.latency)
        return self._result()


class CountingModel(SleepyModel):
    """A `SleepyModel` that counts its calls and can hold the first one."""

    calls: int = 0
    hold: Any = None

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls += 1
        if self.hold is not None and self.calls == 1:
            started, release = self.hold
            started.set()
            release.wait(30)
        return super()._generate(messages, *args, **kwargs)


def ours(model: BaseChatModel, saver: Any, **settings: Any) -> Any:
    config = LoopConfig(model=model, personas=PERSONAS, default_persona="p", **settings)
    return build_graph(config, saver)


def lock_variants(graph: Any) -> dict[str, Any]:
    """Two copies of the graph, one with the session lock off (what every run did
    before it existed). Both are copies with the switch in their own attributes,
    so neither pays for a different instance-dict layout: an uncopied original
    ran ~30 k fewer instructions of attribute lookups per turn than a copy."""
    on, off = graph.copy(), graph.copy()
    on._session = on._session
    off._session = lambda config: None
    return {"on": on, "off": off}


# -- lock overhead ------------------------------------------------------------------

WARM_UP_PAIRS = 50


def turn_input(name: str, i: int) -> tuple[dict, dict]:
    """A one-message turn on a thread of its own, so the transcript stays short."""
    return {"messages": [HumanMessage("你好")]}, {"configurable": {"thread_id": f"{name}-{i}"}}


COLLECT_EVERY = 50


def schedule(pairs: int) -> Iterator[tuple[int, str, bool]]:
    """(pair, column, timed) for every turn, the warm-up pairs untimed; the order
    flips every pair, so neither column always runs second.

    Automatic garbage collection is off, and the heap is collected between
    pairs every `COLLECT_EVERY`, untimed. A collection runs in whichever turn
    crosses the threshold, and in alternating pairs that was always the locked
    turn (152 of 152 over 1,000 pairs), which charged both columns' collections
    to the lock: +2–3 % that was not its own. Run alone, each column triggers
    about as many (75 and 70 per 1,000 turns)."""
    gc.disable()
    try:
        for i in range(WARM_UP_PAIRS + pairs):
            if i % COLLECT_EVERY == 0:
                gc.collect()
            for name in ("on", "off") if i % 2 else ("off", "on"):
                yield i, name, i >= WARM_UP_PAIRS
    finally:
        gc.enable()


def lock_overhead(url: str, pairs: int, asynchronous: bool = False) -> tuple[float, float]:
    """CPU ms per turn with the lock on and off, in alternating pairs of single turns.

    Pairs of single turns, not blocks of many: a neighbour on a shared machine
    then slows both columns alike (blocks of 50 turns moved by up to 80 % each,
    and their ratio by ±10 % between runs)."""
    if asynchronous:
        return asyncio.run(alock_overhead(url, pairs))
    with open_checkpointer(url) as saver:
        graphs = lock_variants(ours(SleepyModel(latency=0), saver))
        spent = {"on": 0.0, "off": 0.0}
        for i, name, timed in schedule(pairs):
            started = time.process_time()
            graphs[name].invoke(*turn_input(name, i))
            spent[name] += time.process_time() - started if timed else 0.0
    return spent["on"] / pairs * 1000, spent["off"] / pairs * 1000


async def alock_overhead(url: str, pairs: int) -> tuple[float, float]:
    async with open_checkpointer(url) as saver:
        graphs = lock_variants(ours(SleepyModel(latency=0), saver))
        spent = {"on": 0.0, "off": 0.0}
        for i, name, timed in schedule(pairs):
            started = time.process_time()
            await graphs[name].ainvoke(*turn_input(name, i))
            spent[name] += time.process_time() - started if timed else 0.0
    return spent["on"] / pairs * 1000, spent["off"] / pairs * 1000


def bench_lock_overhead(pairs: int, folder: Path) -> list[Row]:
    rows: list[Row] = []
    cases = (
        ("in-memory saver", "memory", pairs, False),
        ("in-memory saver, async", "memory", pairs, True),
        ("SQLite saver", f"sqlite:///{folder}/lock.db", pairs // 3, False),  # fsync: slower
    )
    for name, url, case_pairs, asynchronous in cases:
        on, off = lock_overhead(url, case_pairs, asynchronous)
        rows.append(
            (
                f"turn with the session lock, {name} (CPU ms)",
                f"{on:.2f}",
                f"lock off {off:.2f}",
                on / off,
                "≤ 1.05×",
            )
        )
    return rows


# -- 50 sessions at once ----------------------------------------------------------------


async def turn_rate(graph: Any, sessions: int, seconds: float, tag: str) -> tuple[float, float]:
    """Turns per second and CPU ms per turn, `sessions` sessions sending back to back."""
    stop = time.monotonic() + seconds
    done = 0

    async def session(i: int) -> None:
        nonlocal done
        n = 0
        while time.monotonic() < stop:
            await graph.ainvoke(
                {"messages": [HumanMessage(f"第{n}句")]},
                {"configurable": {"thread_id": f"{tag}-{i}"}},
            )
            done += 1
            n += 1

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    return done / (time.monotonic() - started), (time.process_time() - cpu) / done * 1000


async def load(sessions: int, seconds: float, rounds: int) -> dict[str, list[tuple[float, float]]]:
    async with open_checkpointer("memory") as ours_saver, open_checkpointer("memory") as peer_saver:
        graphs = {
            "ours": ours(SleepyModel(), ours_saver),
            "peer": create_agent(
                SleepyModel(), tools=[], system_prompt="你是P。", checkpointer=peer_saver
            ),
        }
        await turn_rate(graphs["ours"], sessions, 1, "warm")
        await turn_rate(graphs["peer"], sessions, 1, "warm")
        samples: dict[str, list[tuple[float, float]]] = {"ours": [], "peer": []}
        for r in range(rounds):
            for name, graph in graphs.items():
                samples[name].append(await turn_rate(graph, sessions, seconds, f"{name}{r}"))
    return samples


def bench_load(sessions: int, seconds: float, rounds: int) -> list[Row]:
    samples = asyncio.run(load(sessions, seconds, rounds))
    rate = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
    return [
        (
            f"{sessions} sessions at once, 200 ms model (turns/s)",
            f"{rate['ours']:.0f}",
            f"create_agent {rate['peer']:.0f}",
            rate["ours"] / rate["peer"],
            "≥ 0.9×",
        ),
        (
            f"  CPU per turn at {sessions} sessions (ms)",
            f"{cpu['ours']:.2f}",
            f"create_agent {cpu['peer']:.2f}",
            cpu["ours"] / cpu["peer"],
            "reported",
        ),
    ]


# -- a burst of group messages ------------------------------------------------------


def burst_calls(policy: str) -> int:
    """Model calls until a running turn and five messages sent during it are answered."""
    started, release = threading.Event(), threading.Event()
    model = CountingModel(latency=0.01, hold=(started, release))
    with open_checkpointer("memory") as saver:
        graph = ours(model, saver, features=[Sessions(busy_policy=policy)])
        group = SessionEnv(actor="group")

        def send(i: int) -> None:
            message = HumanMessage(f"第{i}条", name=f"成员{i}")
            graph.invoke(
                {"messages": [message]}, {"configurable": {"thread_id": "g"}}, context=group
            )

        callers = [threading.Thread(target=send, args=(0,))]
        callers[0].start()
        started.wait(10)
        for i in range(1, 6):
            callers.append(threading.Thread(target=send, args=(i,)))
            callers[-1].start()
            while queued(graph, "g") < i:
                time.sleep(0.001)
        release.set()
        for caller in callers:
            caller.join()
    return model.calls


def bench_burst() -> list[Row]:
    merged, queued_calls = burst_calls("merge"), burst_calls("enqueue")
    return [
        (
            "a burst of 5 group messages during a turn (model calls)",
            f"merge {merged}",
            f"enqueue {queued_calls}",
            merged / queued_calls,
            "merge: 2 (the running turn + one for the burst)",
        )
    ]


def bench_traffic(quick: bool) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_lock_overhead(200 if quick else 2000, Path(tmp))
    rows += bench_load(50, 3 if quick else 8, 1 if quick else 5)
    return rows + bench_burst()


def main() -> None:
    print_bench(bench_traffic)


if __name__ == "__main__":
    main()
