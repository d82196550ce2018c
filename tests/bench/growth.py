"""Session length: turn latency and database bytes as one session grows, and what pruning frees.

    python -m tests.bench.growth            # 100 / 1,000 / 3,000 turns; writes tests/bench/growth.png
    python -m tests.bench.growth --quick    # 50 / 200 turns, to check that it runs

One session of short chat turns (a zero-latency model that keeps nothing of
what it is sent) on a SQLite file: ours, and `create_agent` on the same saver
and model. `create_agent` stops at 1,000 turns: its checkpoints store the whole
transcript every step, so its file grows with the square of the session. The
latency at a mark is the median of the `WINDOW` turns before it; bytes are the
database's pages (`sqlite_bytes`).

Ours runs in a process of its own, beside the main process's `create_agent`
session and then its Postgres session: a 3,000-turn session costs O(n²) turn
work whatever the saver (every turn loads the whole transcript), and two cores
halve the wall time. Each side runs next to one other busy process for most of
its run; ours runs its last turns alone.

Pruning: ours as it stood at 1,000 turns (a copy) keeps its latest
`DEFAULT_KEEP` checkpoints, on SQLite and on Postgres (a 1,000-turn session of
its own, in a database created for the bench; bytes are the checkpoint tables'
`pg_total_relation_size`). The transcript is checked unchanged.

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

from graph import LoopConfig, Persona, build_graph, open_checkpointer, prune_checkpoints
from graph.storage.retention import DEFAULT_KEEP
from studio.offline_model import OfflineChatModel

MARKS = (100, 1_000, 3_000)
QUICK_MARKS = (50, 200)
PEER_STOP = 1_000
WINDOW = 20
CHART_WINDOW = 50
SAMPLE_EVERY = 25
CHART = Path(__file__).with_name("growth.png")
REPO = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("CYRENE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BENCH_DATABASE = "cyrene_bench_growth"
TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")

Row = tuple[str, str, str, float | str, str]


class SteadyModel(OfflineChatModel):
    """Zero latency, one reply, and nothing kept of what it is sent: 3,000
    turns of recorded requests would hold gigabytes."""

    reply: str = "挺好的，刚看完一本书。你呢，今天有什么开心的事？"

    @property
    def _llm_type(self) -> str:
        return "steady"

    def reply_to(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        return AIMessage(self.reply)


@dataclass
class Record:
    """One session's growth: each turn's latency, and bytes every `SAMPLE_EVERY` turns."""

    label: str
    latency_ms: list[float] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)

    def latency_at(self, mark: int) -> float:
        return statistics.median(self.latency_ms[mark - WINDOW : mark])

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        return cls(data["label"], data["latency_ms"], {int(k): v for k, v in data["sizes"].items()})


def grow(
    record: Record,
    graph: Any,
    size: Callable[[], int],
    turns: int,
    at: Callable[[int], None] = lambda n: None,
) -> Record:
    """`turns` turns of one session, timed; `at(n)` runs after turn n, untimed."""
    for n in range(1, turns + 1):
        started = time.perf_counter()
        graph.invoke(
            {"messages": [HumanMessage(f"第{n}句：今天过得怎么样？跟我说说吧。")]},
            {"configurable": {"thread_id": "growth"}},
        )
        record.latency_ms.append((time.perf_counter() - started) * 1000)
        if n % SAMPLE_EVERY == 0 or n in MARKS or n in QUICK_MARKS:
            record.sizes[n] = size()
        at(n)
    return record


def ours(saver: Any) -> Any:
    return build_graph(
        LoopConfig(model=SteadyModel(), personas={"p": Persona(name="P")}, default_persona="p"),
        saver,
    )


def peer(saver: Any) -> Any:
    return create_agent(SteadyModel(), tools=[], checkpointer=saver)


def sqlite_bytes(db: Path) -> int:
    """The database's size on disk once its write-ahead log is folded in (pages × page size).

    The WAL itself is left out: it is a bounded buffer (about 4 MB here) that
    would swamp the small sessions' figures.
    """
    with sqlite3.connect(db) as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def bench_growth(
    folder: Path, marks: Sequence[int] = MARKS, chart: Path | None = CHART
) -> list[Row]:
    """Ours to the last mark (in its own process), `create_agent` to `PEER_STOP`, then Postgres."""
    stop = min(PEER_STOP, marks[-1])
    mine = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.growth", "--ours", str(folder), str(marks[-1])],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    peer_db = folder / "peer.db"
    with open_checkpointer(f"sqlite:///{peer_db}") as saver:
        theirs = grow(Record("create_agent"), peer(saver), lambda: sqlite_bytes(peer_db), stop)
    postgres_rows = bench_prune_postgres(stop)
    if mine.wait() != 0:
        raise RuntimeError(f"the session of ours failed (exit code {mine.returncode})")
    ours_record = Record.load(folder / "ours.json")
    if chart is not None:
        draw(ours_record, theirs, chart)
    return (
        growth_rows(ours_record, theirs, marks, stop)
        + prune_sqlite(folder / "ours-copy.db", stop)
        + postgres_rows
    )


def grow_ours(folder: Path, turns: int) -> None:
    """The `--ours` process: our session on SQLite, with a copy at `PEER_STOP` turns to prune."""
    db, copy_db = folder / "ours.db", folder / "ours-copy.db"
    with open_checkpointer(f"sqlite:///{db}") as saver:

        def at(n: int) -> None:
            if n == min(PEER_STOP, turns):
                with sqlite3.connect(copy_db) as copy:
                    saver.conn.backup(copy)
            if n in MARKS or n in QUICK_MARKS:
                print(f"  growth: ours at {n} turns", file=sys.stderr)

        record = grow(Record("ours"), ours(saver), lambda: sqlite_bytes(db), turns, at)
    record.save(folder / "ours.json")


def growth_rows(mine: Record, theirs: Record, marks: Sequence[int], stop: int) -> list[Row]:
    rows: list[Row] = []
    for mark in marks:
        peer_ms = theirs.latency_at(mark) if mark <= stop else None
        rows.append(
            (
                f"turn latency, session at {mark:,} turns (ms)",
                f"{mine.latency_at(mark):.1f}",
                f"create_agent {peer_ms:.1f}" if peer_ms else f"create_agent stopped at {stop:,}",
                mine.latency_at(mark) / peer_ms if peer_ms else "—",
                "reported",
            )
        )
    for mark in marks:
        peer_size = theirs.sizes.get(mark)
        rows.append(
            (
                f"database bytes, session at {mark:,} turns",
                mb(mine.sizes[mark]),
                f"create_agent {mb(peer_size)}"
                if peer_size
                else f"create_agent stopped at {stop:,}",
                mine.sizes[mark] / peer_size if peer_size else "—",
                "reported",
            )
        )
    first, last = marks[0], marks[-1]
    ours_growth = mine.latency_at(stop) / mine.latency_at(first)
    peer_growth = theirs.latency_at(stop) / theirs.latency_at(first)
    rows.append(
        (
            f"turn latency growth, {first:,} → {stop:,} turns",
            f"{ours_growth:.2f}×",
            f"create_agent {peer_growth:.2f}×",
            ours_growth / peer_growth,
            "≤ 1× (no faster than create_agent)",
        )
    )
    if last > stop:
        rows.append(
            (
                f"turn latency growth, {first:,} → {last:,} turns",
                f"{mine.latency_at(last) / mine.latency_at(first):.2f}×",
                "—",
                "—",
                "reported",
            )
        )
    bytes_growth = mine.sizes[stop] / mine.sizes[first]
    peer_bytes_growth = theirs.sizes[stop] / theirs.sizes[first]
    rows.append(
        (
            f"database bytes growth, {first:,} → {stop:,} turns",
            f"{bytes_growth:.1f}×",
            f"create_agent {peer_bytes_growth:.1f}×",
            bytes_growth / peer_bytes_growth,
            "< 1× (create_agent's grows with the square)",
        )
    )
    return rows


def prune_and_check(saver: Any, size: Callable[[], int]) -> tuple[int, int, float]:
    """Bytes before and after pruning the session, and the seconds the prune took;
    fails if a single message of the transcript changed."""
    graph = ours(saver)
    config = {"configurable": {"thread_id": "growth"}}
    before_messages = [m.model_dump() for m in graph.get_state(config).values["messages"]]
    before = size()
    started = time.perf_counter()
    prune_checkpoints(saver, keep=DEFAULT_KEEP)
    seconds = time.perf_counter() - started
    after_messages = [m.model_dump() for m in graph.get_state(config).values["messages"]]
    if after_messages != before_messages:
        raise AssertionError("pruning changed the transcript")
    return before, size(), seconds


def prune_sqlite(db: Path, turns: int) -> list[Row]:
    with open_checkpointer(f"sqlite:///{db}") as saver:
        before, after, seconds = prune_and_check(saver, lambda: sqlite_bytes(db))
    return [
        (
            f"SQLite, {turns:,}-turn session: bytes on disk after `prune --keep {DEFAULT_KEEP}`",
            mb(after),
            f"before {mb(before)}",
            after / before,
            f"transcript unchanged (checked); prune took {seconds:.1f} s",
        )
    ]


def bench_prune_postgres(turns: int) -> list[Row]:
    """A `turns`-turn session in a database of its own, pruned; bytes of its checkpoint tables."""
    try:
        import psycopg

        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except Exception as exc:
        return [(f"Postgres, {turns:,}-turn session", "—", "—", "—", f"skipped: {exc}")]
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{BENCH_DATABASE}"
    with admin:
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {BENCH_DATABASE}")
    try:
        with psycopg.connect(url, autocommit=True) as conn:

            def size() -> int:
                return sum(
                    conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0]
                    for t in TABLES
                )

            with open_checkpointer(url) as saver:
                session = grow(Record("postgres"), ours(saver), size, turns)
                before, after, seconds = prune_and_check(saver, size)
            conn.execute(f"VACUUM FULL {', '.join(TABLES)}")
            full = size()
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")
    return [
        (
            f"Postgres, {turns:,}-turn session: checkpoint tables after `prune --keep {DEFAULT_KEEP}` (plain VACUUM)",
            mb(after),
            f"before {mb(before)}",
            after / before,
            f"transcript unchanged (checked); prune took {seconds:.1f} s",
        ),
        (
            f"Postgres, {turns:,}-turn session: … then VACUUM FULL (locks the tables)",
            mb(full),
            f"before {mb(before)}",
            full / before,
            "reported",
        ),
        (
            f"Postgres turn latency, session at {turns:,} turns (ms)",
            f"{session.latency_at(turns):.1f}",
            "—",
            "—",
            "reported",
        ),
    ]


def draw(mine: Record, theirs: Record, path: Path) -> None:
    """Two panels, ours beside `create_agent`: turn latency and database size against turns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for session, style in ((mine, "-"), (theirs, "--")):
        turns = range(CHART_WINDOW, len(session.latency_ms) + 1)
        smooth = [statistics.median(session.latency_ms[n - CHART_WINDOW : n]) for n in turns]
        left.plot(turns, smooth, style, label=session.label)
        marks = sorted(session.sizes)
        right.plot(marks, [session.sizes[n] / 1e6 for n in marks], style, label=session.label)
    stop = len(theirs.latency_ms)
    for axis in (left, right):
        axis.axvline(stop, color="grey", linewidth=0.6)
        axis.set_xlabel("turns in the session")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left")
    left.set_ylabel(f"turn latency, ms (median of {CHART_WINDOW} turns)")
    right.set_ylabel("database on disk, MB (SQLite)")
    right.annotate(
        f"create_agent stopped at {stop:,} turns",
        xy=(stop, theirs.sizes[max(theirs.sizes)] / 1e6),
        xytext=(8, -14),
        textcoords="offset points",
        fontsize=8,
    )
    fig.suptitle(
        "One session, zero-latency model, same SQLite saver: ours vs create_agent. "
        f"At {stop:,} turns: {mb(mine.sizes[stop])} vs {mb(theirs.sizes[stop])}"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
    marks = QUICK_MARKS if args.quick else MARKS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_growth(Path(tmp), marks, chart=None if args.quick else CHART)
    print(f"  took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print_table(rows)


if __name__ == "__main__":
    main()
