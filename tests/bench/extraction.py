"""Extraction under load: do memories land while turns keep coming, and what do turns pay?

    python -m tests.bench.extraction            # 20 sessions × 20 s, embedded Chroma
    python -m tests.bench.extraction --quick    # 20 sessions × 8 s
    python -m tests.bench.extraction --server   # the same against a `chroma run` server

Twenty async sessions run turns back to back in one process (a 50 ms model
that sleeps with `asyncio.sleep`), each turn saying one new fact that a
background extractor turns into one memory, on a store that already holds
2,000 memories. Measured: memories stored while
the load ran, the lag from a turn's reply to its memory being stored (p50 /
p95 over every memory; one stored after the load counts with its real lag),
the deepest the extraction queue got, and turn latency and CPU per turn
against the same load with memory reads but no extractor; and the CPU one background
memory costs, planned and written as the pipeline does (chunks of 8). Then single turns:
idle, and started right after the first chunk of a 200-item background write
landed. Last, crash trials: a worker SIGKILLed mid-extraction, then restarted.
`bench_extraction(...)` and `bench_extraction_crashes(...)` append their rows to
`tests.bench.run.ROWS`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from graph import LoopConfig, Persona, build_graph, open_checkpointer, wait_for_extractions
from memory import Change, Extractor, MemoryItem, MemoryStore, Scope, Source
from nodes.extraction.background import queue_depth
from nodes.extraction.cycle import QUIET_CHUNK
from nodes.extraction.planning import apply_changes, plan_extraction
from nodes.kernel.messages import last_human, message_text
from tests.bench.table import ROWS, elapsed_ms, row
from tests.conftest import free_port, wait_for_port
from tests.scripted import ScriptedChatModel

SESSIONS = 20
PREFILLED = 2_000
MODEL_SECONDS = 0.05


class SleepingModel(ScriptedChatModel):
    """The scripted model, answering "好的" after a sleep (a hosted model's wait).

    It keeps no script and records no requests: a long script makes LangChain
    serialise it on every call, which would measure that instead of the loop."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        time.sleep(MODEL_SECONDS)
        return ChatResult(generations=[ChatGeneration(message=AIMessage("好的"))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(MODEL_SECONDS)
        return ChatResult(generations=[ChatGeneration(message=AIMessage("好的"))])


class FactExtractor:
    """A background extractor: the turn's fact, one memory (no model call of its own)."""

    background = True

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        human = last_human(messages)
        assert human is not None
        return [MemoryItem(content=message_text(human), scope=Scope.USER)]


class BulkExtractor:
    """A background extractor with 200 memories to write, as after a long conversation."""

    background = True

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        stamp = time.time_ns()
        return [
            MemoryItem(content=f"背景记忆 {stamp} {i} " * 5, kind="bg", scope=Scope.USER)
            for i in range(200)
        ]


class TimedStore(MemoryStore):
    """The real store, noting when each memory's write first returned (by its text: a
    background extraction's memory has an id from the extraction, not from its words)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored_at: dict[str, float] = {}
        self.writing = threading.Event()

    def add_many(self, items: Iterable[MemoryItem]) -> list[str]:
        items = list(items)
        ids = super().add_many(items)
        now = time.monotonic()
        for item in items:
            self.stored_at.setdefault(item.content, now)
        self.writing.set()
        return ids


def config_for(
    store: MemoryStore, extractor: Extractor | None, model: ScriptedChatModel | None = None
) -> LoopConfig:
    return LoopConfig(
        model=model or SleepingModel(),
        personas={"p": Persona()},
        default_persona="p",
        memory=store,
        extractor=extractor,
    )


async def run_load(
    store: MemoryStore, extracting: bool, seconds: float
) -> tuple[list[float], dict[str, float], float, float]:
    """Turn latencies (ms), reply time per memory id, when the load ended, CPU ms per turn."""
    latencies: list[float] = []
    replied: dict[str, float] = {}
    cpu = time.process_time()
    async with open_checkpointer("memory") as saver:
        graph = build_graph(config_for(store, FactExtractor() if extracting else None), saver)
        end = time.monotonic() + seconds

        async def session(n: int) -> None:
            turn = 0
            while time.monotonic() < end:
                fact = f"第{n}位主人的第{turn}件事 {time.time_ns()}"
                started = time.monotonic()
                await graph.ainvoke(
                    {"messages": [HumanMessage(fact)]}, {"configurable": {"thread_id": f"s{n}"}}
                )
                done = time.monotonic()
                latencies.append((done - started) * 1000)
                replied[fact] = done
                turn += 1

        await asyncio.gather(*(session(n) for n in range(SESSIONS)))
    load_end = time.monotonic()
    if extracting:
        wait_for_extractions(120)  # the pipeline's CPU belongs to these turns
    cpu_per_turn = (time.process_time() - cpu) * 1000 / max(len(latencies), 1)
    return latencies, replied, load_end, cpu_per_turn


def depth_sampler(stop: threading.Event, samples: list[int]) -> None:
    """The extraction queue's depth every 100 ms."""
    while not stop.wait(0.1):
        samples.append(queue_depth())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_under_load(store: TimedStore, seconds: float, where: str) -> None:
    """The load without an extractor (half before, half after), and with one."""
    before, _, _, cpu_before = asyncio.run(run_load(store, False, seconds / 2))
    stop, depths = threading.Event(), list[int]()
    sampler = threading.Thread(target=depth_sampler, args=(stop, depths), daemon=True)
    sampler.start()
    latencies, replied, load_end, cpu = asyncio.run(run_load(store, True, seconds))
    stop.set()
    after, _, _, cpu_after = asyncio.run(run_load(store, False, seconds / 2))
    stored_at = store.stored_at
    during = sum(1 for i in replied if stored_at.get(i, float("inf")) <= load_end)
    lags = [stored_at.get(i, float("inf")) - replied[i] for i in replied]
    ours, peer = statistics.median(latencies), statistics.median(before + after)
    row(
        f"extraction under load{where}: memories stored during {seconds:.0f} s, {SESSIONS} sessions",
        f"{during:,} of {len(replied):,}",
        f"queue depth max {max(depths, default=0)}",
        f"{during / max(len(replied), 1):.0%}",
        "all but the last ~2 s",
    )
    row(
        f"extraction under load{where}: reply → stored lag p50 / p95 (s)",
        f"{percentile(lags, 0.5):.2f} / {percentile(lags, 0.95):.2f}",
        "—",
        "—",
        "p95 < 2 s",
    )
    row(
        f"extraction under load{where}: turn latency p50 (ms)",
        f"{ours:.0f}",
        f"no extractor {peer:.0f}",
        ours / peer,
        "≤ 1.1×",
    )
    row(
        f"extraction under load{where}: CPU per turn (ms)",
        f"{cpu:.1f}",
        f"no extractor {(cpu_before + cpu_after) / 2:.1f}",
        cpu / ((cpu_before + cpu_after) / 2),
        "reported",
    )


def bench_cpu_per_memory(store: MemoryStore, memories: int = 400) -> None:
    """CPU per background memory: each planned alone (`plan_extraction`: the extractor,
    the near-duplicate check where the store does not check as it writes), then written
    8 at a time (`apply_changes`), as the writer's quiet chunks are; one thread."""
    planning = writing = 0.0
    chunk: list[Change] = []
    for n in range(memories):
        fact = f"第{n % SESSIONS}位主人的第{n}件事 {time.time_ns()}"
        source = Source(session_id=f"s{n % SESSIONS}", message_id=f"m{n}", extraction=f"k{n}")
        started = time.process_time()
        chunk += plan_extraction(
            FactExtractor(), [HumanMessage(fact)], store, persona_id="p", source=source
        )
        planning += time.process_time() - started
        if len(chunk) == QUIET_CHUNK or n == memories - 1:
            started = time.process_time()
            apply_changes(store, chunk)
            writing += time.process_time() - started
            chunk = []
    row(
        "extraction: CPU per background memory, planned + written (ms)",
        f"{(planning + writing) * 1000 / memories:.1f}",
        f"planned {planning * 1000 / memories:.1f}, written {writing * 1000 / memories:.1f}",
        "—",
        "reported",
    )


def bench_turn_during_writes(store: TimedStore, repeat: int, where: str) -> None:
    """An idle turn, then a turn started as soon as the first chunk of the previous turn's
    200-item background write has landed (so it meets the rest of that write)."""
    graph = build_graph(config_for(store, BulkExtractor(), Instant()))
    ids = iter(range(10**9))

    def turn() -> None:
        graph.invoke(
            {"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": f"w{next(ids)}"}}
        )

    idle, busy = [], []
    for _ in range(repeat):
        wait_for_extractions(60)
        store.writing.clear()
        idle.append(elapsed_ms(turn))
        store.writing.wait(30)
        busy.append(elapsed_ms(turn))
    wait_for_extractions(60)
    ours, peer = statistics.median(busy), statistics.median(idle)
    row(
        f"turn while a 200-item extraction writes{where} (ms)",
        f"{ours:.1f}",
        f"idle {peer:.1f}",
        ours / peer,
        "≤ 1.1×",
    )


class Instant(ScriptedChatModel):
    """Answers "嗯" at once, as often as asked."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("嗯"))])


@contextlib.contextmanager
def chroma_server(folder: Path) -> Iterator[int]:
    """A `chroma run` on a free port for the length of the block."""
    binary = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    port = free_port()
    proc = subprocess.Popen(
        [binary, "run", "--path", str(folder), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )
    try:
        if not wait_for_port(port, 60, proc):
            raise RuntimeError("`chroma run` did not start")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def bench_extraction_crashes(folder: Path, trials: int) -> None:
    """SIGKILL a worker once its turn replied and its extraction runs; restart it, recovering
    on the session's next turn, through `resume_extractions`, or `aresume_extractions`."""
    from tests.test_extraction_durable import calls, finish, kill_mid_extraction

    survived = 0
    for trial in range(trials):
        data = folder / f"crash-{trial}"
        data.mkdir()
        kill_mid_extraction(data)
        after = finish(data, ("next", "recover", "arecover")[trial % 3])
        survived += (
            after["memories"] == ["我喜欢乌龙茶"]
            and calls(data).count("call 记住 我喜欢乌龙茶") == 2
        )
    row(
        "SIGKILL mid-extraction, restart: memory stored exactly once (trials)",
        f"{survived}/{trials}",
        "—",
        f"lost {trials - survived}",
        "every trial, 0 lost",
    )


def bench_extraction(seconds: float, repeat: int, folder: Path, server: bool = False) -> None:
    """Every row of this module, on an embedded store or on a Chroma server."""
    with contextlib.ExitStack() as stack:
        store = (
            TimedStore.connect(port=stack.enter_context(chroma_server(folder / "server")))
            if server
            else TimedStore.open(folder / "embedded")
        )
        assert isinstance(store, TimedStore)
        stack.callback(store.close)
        # A companion's store is not empty: on an empty one a turn's memory search finds
        # nothing and costs nothing, which made the baseline's first half cheaper than any
        # turn on a store in use (5.0 vs 7.8 ms CPU a turn after the load's 1,250 memories).
        store.add_many(
            MemoryItem(content=f"第{n % 20}位主人以前说过的第{n}件事", scope=Scope.USER)
            for n in range(PREFILLED)
        )
        where = " (Chroma server)" if server else ""
        bench_under_load(store, seconds, where)
        bench_cpu_per_memory(store)
        bench_turn_during_writes(store, repeat, where)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--server", action="store_true", help="memory on a `chroma run` server")
    args = parser.parse_args()
    seconds = args.seconds or (8.0 if args.quick else 20.0)
    with tempfile.TemporaryDirectory() as tmp:
        bench_extraction(seconds, 8 if args.quick else 20, Path(tmp), server=args.server)
        bench_extraction_crashes(Path(tmp), 3 if args.quick else 9)
    print("| benchmark | ours | peer | ratio | target |\n|---|---|---|---|---|")
    for cells in ROWS:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
