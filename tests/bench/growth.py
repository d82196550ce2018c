"""Session length: a turn's cost and the bytes it writes as one session grows to 10,000 turns.

    python -m tests.bench.growth            # 10,000 turns; writes tests/bench/growth.png
    python -m tests.bench.growth --quick    # 300 turns, to check that it runs

One session of short chat turns (a zero-latency model that keeps nothing of
what it is sent), compaction on (`Compaction(max_context_tokens=2000)`, so the session
reaches its steady state within its first hundred turns): ours on a SQLite
file and on Postgres, and `create_agent` on SQLite beside it up to 1,000 turns
(its checkpoints store the whole transcript every step, so its file grows
with the square of the session). "Near turn n" is the `WINDOW` turns before n:
the median turn's wall time and CPU time, and the bytes the database grew by
over those turns, per turn. The turns near turn 100 include the session's
first ones, before its first compaction moved anything to the archive.
Paired: once at 10,000 turns, the old session alternates turn for turn with a
new one in the same database (`pair_ages`), so the two ages are compared under
the same load; the young session's turns 51-150 against the old one's beside
them.

Ours on SQLite runs in a process of its own, beside the main process's
`create_agent` session and then its Postgres session, so two cores halve the
wall time; the CPU columns are what to compare across rows.

Pruning: ours as it stood at 1,000 turns (a copy) keeps its latest
`DEFAULT_KEEP` checkpoints; the whole transcript is checked unchanged.

`bench_growth(folder)` returns the rows for `tests/bench/run.py`'s `row`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import Compaction, LoopConfig, Persona, build_graph, open_checkpointer, prune_checkpoints
from graph.storage.retention import DEFAULT_KEEP
from studio.demo.offline_model import OfflineChatModel

TURNS, QUICK_TURNS = 10_000, 300
PEER_STOP = 1_000
BUDGET = 2_000
WINDOW = 100
PAIRED = range(51, 151)
SAMPLE_EVERY = 25
CHART = Path(__file__).with_name("growth.png")
REPO = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("CYRENE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BENCH_DATABASE = "cyrene_bench_growth"

Row = tuple[str, str, str, float | str, str]


class SteadyModel(OfflineChatModel):
    """Zero latency, one reply, and nothing kept of what it is sent: 10,000
    turns of recorded requests would hold gigabytes."""

    text: str = "挺好的，刚看完一本书。你呢，今天有什么开心的事？"

    @property
    def _llm_type(self) -> str:
        return "steady"

    def reply_to(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        return AIMessage(self.text)


@dataclass
class Record:
    """One session's growth: each turn's wall and CPU time, and bytes every `SAMPLE_EVERY`."""

    label: str
    latency_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    paired: dict[str, list[float]] = field(default_factory=dict)
    """`pair_ages`'s samples: CPU ms of the old and the young session's alternating turns."""

    def latency_at(self, mark: int) -> float:
        return statistics.median(self.latency_ms[max(mark - WINDOW, 0) : mark])

    def cpu_at(self, mark: int) -> float:
        return statistics.median(self.cpu_ms[max(mark - WINDOW, 0) : mark])

    def bytes_per_turn_at(self, mark: int) -> float:
        start = max(mark - WINDOW, 0)
        return (self.sizes[mark] - self.sizes.get(start, 0)) / (mark - start)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        sizes = {int(k): v for k, v in data.pop("sizes").items()}
        return cls(**data, sizes=sizes)


def turn(graph: Any, thread: str, n: int) -> tuple[float, float]:
    """Turn `n` of session `thread`: its wall and CPU milliseconds."""
    started, cpu = time.perf_counter(), time.process_time()
    graph.invoke(
        {"messages": [HumanMessage(f"第{n}句：今天过得怎么样？跟我说说吧。")]},
        {"configurable": {"thread_id": thread}},
    )
    return (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000


def pair_ages(record: Record, graph: Any, turns: int) -> None:
    """The old session against a young one in the same database, turn for turn.

    Turn times measured hours apart on a shared machine differ by more than the
    session's age makes them differ; alternating one turn of a new session with one
    of the `turns`-turn session compares the two ages under the same load. The
    young session's turns `PAIRED` (centred on turn 100) are kept, with the old
    session's turns beside them.
    """
    old, young = [], []
    for n in range(1, PAIRED.stop):
        young.append(turn(graph, "young", n)[1])
        old.append(turn(graph, "growth", turns + n)[1])
    record.paired = {"old": old[PAIRED.start - 1 :], "young": young[PAIRED.start - 1 :]}


def grow(
    record: Record,
    graph: Any,
    size: Callable[[], int],
    turns: int,
    at: Callable[[int], None] = lambda n: None,
) -> Record:
    """`turns` turns of one session, timed; `at(n)` runs after turn n, untimed."""
    record.sizes[0] = size()
    for n in range(1, turns + 1):
        latency, cpu = turn(graph, "growth", n)
        record.latency_ms.append(latency)
        record.cpu_ms.append(cpu)
        if n % SAMPLE_EVERY == 0:
            record.sizes[n] = size()
        at(n)
    return record


def ours(saver: Any) -> Any:
    return build_graph(
        LoopConfig(
            model=SteadyModel(),
            personas={"p": Persona(name="P")},
            default_persona="p",
            features=[Compaction(max_context_tokens=BUDGET)],
        ),
        saver,
    )


def peer(saver: Any) -> Any:
    return create_agent(SteadyModel(), tools=[], checkpointer=saver)


def sqlite_bytes(db: Path) -> int:
    """The database's size on disk once its write-ahead log is folded in (pages × page size)."""
    with sqlite3.connect(db) as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def mb(size: float) -> str:
    return f"{size / 1e6:,.1f} MB"


def kb(size: float) -> str:
    return f"{size / 1e3:,.1f} KB"


def bench_growth(folder: Path, turns: int = TURNS, chart: Path | None = CHART) -> list[Row]:
    """Ours on SQLite to `turns` (its own process), `create_agent` to `PEER_STOP`, then ours on
    Postgres to `turns`."""
    stop = min(PEER_STOP, turns)
    mine = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.growth", "--ours", str(folder), str(turns)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    peer_db = folder / "peer.db"
    with open_checkpointer(f"sqlite:///{peer_db}") as saver:
        theirs = grow(Record("create_agent"), peer(saver), lambda: sqlite_bytes(peer_db), stop)
    postgres = grow_postgres(turns)
    if mine.wait() != 0:
        raise RuntimeError(f"the session of ours failed (exit code {mine.returncode})")
    sqlite_record = Record.load(folder / "ours.json")
    if chart is not None:
        from tests.bench.growth_chart import draw  # matplotlib only when drawing

        records = [sqlite_record, *([postgres] if postgres else []), theirs]
        draw(records, stop, chart, BUDGET)
    return growth_rows(sqlite_record, postgres, theirs, turns, stop) + prune_sqlite(
        folder / "ours-copy.db", stop
    )


def grow_ours(folder: Path, turns: int) -> None:
    """The `--ours` process: our session on SQLite, with a copy at `PEER_STOP` turns to prune."""
    db, copy_db = folder / "ours.db", folder / "ours-copy.db"
    with open_checkpointer(f"sqlite:///{db}") as saver:

        def at(n: int) -> None:
            if n == min(PEER_STOP, turns):
                with sqlite3.connect(copy_db) as copy:
                    saver.conn.backup(copy)
            if n % 1000 == 0:
                print(f"  growth: ours (SQLite) at {n:,} turns", file=sys.stderr)

        graph = ours(saver)
        record = grow(Record("ours, SQLite"), graph, lambda: sqlite_bytes(db), turns, at)
        pair_ages(record, graph, turns)
    record.save(folder / "ours.json")


def grow_postgres(turns: int) -> Record | None:
    """Ours on Postgres, in a database created for the bench; bytes are the whole database's."""
    try:
        import psycopg

        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except Exception as exc:
        print(f"  growth: Postgres skipped ({exc})", file=sys.stderr)
        return None
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{BENCH_DATABASE}"
    with admin:
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {BENCH_DATABASE}")
    try:
        with psycopg.connect(url, autocommit=True) as conn, open_checkpointer(url) as saver:

            def size() -> int:
                return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]

            def at(n: int) -> None:
                if n % 1000 == 0:
                    print(f"  growth: ours (Postgres) at {n:,} turns", file=sys.stderr)

            graph = ours(saver)
            record = grow(Record("ours, Postgres"), graph, size, turns, at)
            pair_ages(record, graph, turns)
            return record
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")


def growth_rows(
    sqlite: Record, postgres: Record | None, theirs: Record, turns: int, stop: int
) -> list[Row]:
    first = WINDOW
    rows: list[Row] = [
        (
            f"turn latency, session at {mark:,} turns, SQLite (ms)",
            f"{sqlite.latency_at(mark):.1f} (CPU {sqlite.cpu_at(mark):.1f})",
            f"create_agent {theirs.latency_at(mark):.1f} (CPU {theirs.cpu_at(mark):.1f})"
            if mark <= stop
            else f"create_agent stopped at {stop:,}",
            sqlite.cpu_at(mark) / theirs.cpu_at(mark) if mark <= stop else "—",
            "reported (CPU ratio)",
        )
        for mark in sorted({first, stop, turns})
    ]
    for record in [sqlite, *([postgres] if postgres else [])]:
        backend = record.label.split(", ")[1]
        rows += [
            (
                f"{backend}: turn CPU near turn {turns:,} vs near turn {first} (ms)",
                f"{record.cpu_at(turns):.1f}",
                f"{record.cpu_at(first):.1f}",
                record.cpu_at(turns) / record.cpu_at(first),
                "≤ 1.2×",
            ),
            (
                f"{backend}: turn CPU at turn {turns:,} vs at turn {first}, alternating turns (ms)",
                f"{statistics.median(record.paired['old']):.1f}",
                f"{statistics.median(record.paired['young']):.1f}",
                statistics.median(record.paired["old"]) / statistics.median(record.paired["young"]),
                "≤ 1.2×",
            ),
            (
                f"{backend}: turn latency near turn {turns:,} vs near turn {first} (ms)",
                f"{record.latency_at(turns):.1f}",
                f"{record.latency_at(first):.1f}",
                record.latency_at(turns) / record.latency_at(first),
                "≤ 1.2×",
            ),
            (
                f"{backend}: bytes written per turn near turn {turns:,} vs near turn {first}",
                kb(record.bytes_per_turn_at(turns)),
                kb(record.bytes_per_turn_at(first)),
                record.bytes_per_turn_at(turns) / record.bytes_per_turn_at(first),
                "≤ 1.2×",
            ),
        ]
        if stop < turns:
            rows.append(
                (
                    f"{backend}: bytes written per turn near turn {turns:,} vs near turn {stop:,}",
                    kb(record.bytes_per_turn_at(turns)),
                    kb(record.bytes_per_turn_at(stop)),
                    record.bytes_per_turn_at(turns) / record.bytes_per_turn_at(stop),
                    "reported (both past the first compaction)",
                )
            )
    rows.append(
        (
            f"database bytes, session at {stop:,} turns (SQLite)",
            mb(sqlite.sizes[stop]),
            f"create_agent {mb(theirs.sizes[stop])}",
            sqlite.sizes[stop] / theirs.sizes[stop],
            "< 1×",
        )
    )
    rows.append(
        (
            f"database bytes, session at {turns:,} turns (SQLite)",
            mb(sqlite.sizes[turns]),
            "—",
            "—",
            "reported",
        )
    )
    return rows


def prune_sqlite(db: Path, turns: int) -> list[Row]:
    """Bytes before and after pruning the session's copy; fails if its transcript changed."""
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = ours(saver)
        config = {"configurable": {"thread_id": "growth"}}
        before_messages = [m.model_dump() for m in graph.transcript(config)]
        before = sqlite_bytes(db)
        started = time.perf_counter()
        prune_checkpoints(saver, keep=DEFAULT_KEEP)
        seconds = time.perf_counter() - started
        if [m.model_dump() for m in graph.transcript(config)] != before_messages:
            raise AssertionError("pruning changed the transcript")
        after = sqlite_bytes(db)
    return [
        (
            f"SQLite, {turns:,}-turn session: bytes on disk after `prune --keep {DEFAULT_KEEP}`",
            mb(after),
            f"before {mb(before)}",
            after / before,
            f"transcript unchanged (checked); prune took {seconds:.1f} s",
        )
    ]


def print_table(rows: Sequence[Row]) -> None:
    """The Markdown table `tests/bench/run.py` prints."""
    print("| benchmark | ours | peer | ratio | target |\n|---|---|---|---|---|")
    for name, mine, theirs, ratio, target in rows:
        ratio_text = f"{ratio:.2f}×" if isinstance(ratio, float) else ratio
        print(f"| {name} | {mine} | {theirs} | {ratio_text} | {target} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ours", nargs=2, metavar=("FOLDER", "TURNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours:
        grow_ours(Path(args.ours[0]), int(args.ours[1]))
        return
    turns = QUICK_TURNS if args.quick else TURNS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_growth(Path(tmp), turns, chart=None if args.quick else CHART)
    print(f"  took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print_table(rows)


if __name__ == "__main__":
    main()
