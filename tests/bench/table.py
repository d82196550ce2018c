"""The benchmark table every bench module adds its rows to (`python -m tests.bench.run` prints it).

A module of its own, so `run.py` (which runs as `__main__`) and the bench
modules it calls share one `ROWS`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

ROWS: list[tuple[str, str, str, str, str]] = []


def row(name: str, ours: str, peer: str, ratio: float | str, target: str) -> None:
    ratio_text = f"{ratio:.2f}×" if isinstance(ratio, float) else ratio
    ROWS.append((name, ours, peer, ratio_text, target))
    print(f"  {name}: {ours} vs {peer} ({ratio_text}, target {target})", file=sys.stderr)


def print_rows(rows: Iterable[tuple[str, str, str, float | str, str]]) -> None:
    """Rows as Markdown table lines on stdout, each as soon as it is measured."""
    for name, ours, peer, ratio, target in rows:
        ratio_text = f"{ratio:.2f}×" if isinstance(ratio, float) else ratio
        print(f"| {name} | {ours} | {peer} | {ratio_text} | {target} |")
        sys.stdout.flush()


def print_bench(
    bench: Callable[[bool], Iterable[tuple[str, str, str, float | str, str]]], argv: Any = None
) -> None:
    """A bench module's `main`: `--quick` for a short run, its rows printed as they come."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print_rows(bench(parser.parse_args(argv).quick))


def elapsed_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(elapsed_ms(fn) for _ in range(repeat))
