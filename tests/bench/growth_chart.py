"""The growth chart (`tests/bench/growth.png`): CPU per turn and database size against turns."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from tests.bench.growth import Record

CHART_WINDOW = 50
"""Each point is the median CPU of this many turns."""


def draw(records: Sequence[Record], stop: int, path: Path, budget: int) -> None:
    """Two panels: CPU per turn and database size against turns, ours beside `create_agent`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for session in records:
        style = "--" if session.label == "create_agent" else "-"
        turns = range(CHART_WINDOW, len(session.cpu_ms) + 1, 10)
        smooth = [statistics.median(session.cpu_ms[n - CHART_WINDOW : n]) for n in turns]
        left.plot(turns, smooth, style, label=session.label)
        marks = sorted(session.sizes)
        right.plot(marks, [session.sizes[n] / 1e6 for n in marks], style, label=session.label)
    for axis in (left, right):
        axis.axvline(stop, color="grey", linewidth=0.6)
        axis.set_xlabel("turns in the session")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left")
    left.set_ylabel(f"CPU per turn, ms (median of {CHART_WINDOW} turns)")
    left.set_yscale("log")
    right.set_ylabel("database, MB")
    fig.suptitle(
        f"One session, zero-latency model, compaction on (budget {budget:,} tokens): ours on "
        f"SQLite and Postgres vs create_agent (stopped at {stop:,} turns)"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
