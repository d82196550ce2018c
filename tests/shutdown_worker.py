"""A worker process for the graceful-shutdown test: one turn under `GracefulStop`.

    python -m tests.shutdown_worker DB LOG start|resume

`start` runs a turn whose model asks for two tools at once; `slow_report` logs
`slow start` and then keeps working until this process has been asked to stop
(SIGTERM from the test), so the signal always lands inside a tool call. The
process exits with `stop.exit_code` (143 after SIGTERM) and logs whether the
turn finished. `resume` finishes the turn with `run_turn(graph, None, …)`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from graph import GracefulStop, LoopConfig, Persona, build_graph, open_checkpointer, run_turn
from tests.scripted import ScriptedChatModel, call, tool_calls

STOP_WAIT = 30.0


def main() -> int:
    db, log_path, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    def log(line: str) -> None:
        with log_path.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    stop = GracefulStop()

    @tool
    def quick_lookup(key: str) -> str:
        """Fast."""
        log(f"quick {key}")
        return f"value of {key}"

    @tool
    def slow_report(topic: str) -> str:
        """Slow: still working when the stop request comes."""
        log("slow start")
        deadline = time.monotonic() + STOP_WAIT
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.02)
        log(f"slow done, stop requested: {stop.requested}")
        return f"report on {topic}"

    def final(messages: list[BaseMessage]) -> AIMessage:
        results = [str(m.content) for m in messages if m.type == "tool"]
        return AIMessage("都查好了：" + "，".join(results))

    batch = tool_calls(
        call("quick_lookup", "call-1", key="k"), call("slow_report", "call-2", topic="t")
    )
    model = ScriptedChatModel(script=[batch, final] if mode == "start" else [final])
    config = LoopConfig(
        model=model,
        personas={"xilian": Persona(name="昔涟", instructions="你是昔涟。")},
        default_persona="xilian",
        tools=[quick_lookup, slow_report],
    )
    thread = {"configurable": {"thread_id": "shutdown"}}
    turn = {"messages": [HumanMessage("查一下", id="u1")]} if mode == "start" else None
    with stop, open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(config, saver)
        finished = run_turn(graph, turn, thread, stop=stop)
        state = graph.get_state(thread)
        log(f"finished={finished} next={','.join(state.next)} exit={stop.exit_code}")
        if finished:
            sent = [m for m in model.requests[-1].messages if m.type != "system"]
            log("sent " + " | ".join(f"{m.type}:{getattr(m, 'tool_call_id', '')}" for m in sent))
            log("reply " + str(state.values["messages"][-1].content))
        stop.drain(timeout=5)
    return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
