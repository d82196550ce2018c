"""A loop process for crash tests: run a turn with two tool calls, log progress, maybe hang.

    python -m tests.crash_worker DB LOG start|resume|new [parallel|sequential]

The second tool (`slow_report`) logs `slow start` and then hangs while
HANG=1, so the parent can SIGKILL this process inside it. SLOW_SAVES=0.3
makes every checkpoint save lag; DURABILITY=async|sync|exit picks the run's
durability (unset: the loop's default).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from langchain_core.messages import HumanMessage

from graph import ToolCalls, build_graph, open_checkpointer
from tests.worker_tools import BATCH, final, log_to, lookup_and_report, sent_line, worker_config


def slowed(put, delay: float):
    """A saver's `put` that lags, as on a loaded disk or a remote database."""

    def slow_put(*args, **kwargs):
        time.sleep(delay)
        return put(*args, **kwargs)

    return slow_put


def main() -> None:
    db, log_path, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    execution = sys.argv[4] if len(sys.argv) > 4 else "parallel"
    log = log_to(log_path)
    tools = lookup_and_report(log, working=lambda: os.environ.get("HANG") == "1")
    script = {"start": [BATCH, final], "resume": [final], "new": [final]}[mode]
    config = worker_config(script, tools, features=[ToolCalls(execution=execution)])
    with open_checkpointer(f"sqlite:///{db}") as saver:
        if delay := float(os.environ.get("SLOW_SAVES", "0")):
            saver.put = slowed(saver.put, delay)
        graph = build_graph(config, saver)
        cfg = {"configurable": {"thread_id": "crash"}}
        turn = {
            "start": {"messages": [HumanMessage("查一下", id="u1")]},
            "resume": None,
            "new": {"messages": [HumanMessage("算了，换个话题", id="u2")]},
        }[mode]
        graph.invoke(turn, cfg, durability=os.environ.get("DURABILITY") or None)
        log(sent_line(config.model.requests[-1].messages))
    log("finished")


if __name__ == "__main__":
    main()
