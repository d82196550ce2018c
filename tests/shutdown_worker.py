"""A worker process for the graceful-shutdown test: one turn under `GracefulStop`.

    python -m tests.shutdown_worker DB LOG start|resume

`start` runs a turn whose model asks for two tools at once; `slow_report` logs
`slow start` and then keeps working until this process has been asked to stop
(SIGTERM from the test), so the signal always lands inside a tool call. The
process exits with `stop.exit_code` (143 after SIGTERM) and logs whether the
turn finished. `resume` finishes the turn with `run_turn(graph, None, …)`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from langchain_core.messages import HumanMessage

from graph import GracefulStop, build_graph, open_checkpointer, run_turn
from tests.worker_tools import BATCH, final, log_to, lookup_and_report, sent_line, worker_config

STOP_WAIT = 30.0


def main() -> int:
    db, log_path, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    log = log_to(log_path)
    stop = GracefulStop()
    deadline = time.monotonic() + STOP_WAIT
    tools = lookup_and_report(
        log,
        working=lambda: not stop.requested and time.monotonic() < deadline,
        done=lambda: f"slow done, stop requested: {stop.requested}",
    )
    config = worker_config([BATCH, final] if mode == "start" else [final], tools)
    thread = {"configurable": {"thread_id": "shutdown"}}
    turn = {"messages": [HumanMessage("查一下", id="u1")]} if mode == "start" else None
    with stop, open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(config, saver)
        finished = run_turn(graph, turn, thread, stop=stop)
        state = graph.get_state(thread)
        log(f"finished={finished} next={','.join(state.next)} exit={stop.exit_code}")
        if finished:
            log(sent_line([m for m in config.model.requests[-1].messages if m.type != "system"]))
            log("reply " + str(state.values["messages"][-1].content))
        stop.drain(timeout=5)
    return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
