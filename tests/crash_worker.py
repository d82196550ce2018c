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

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from graph import LoopConfig, Persona, build_graph, open_checkpointer
from tests.scripted import ScriptedChatModel, call, tool_calls


def slowed(put, delay: float):
    """A saver's `put` that lags, as on a loaded disk or a remote database."""

    def slow_put(*args, **kwargs):
        time.sleep(delay)
        return put(*args, **kwargs)

    return slow_put


def main() -> None:
    db, log_path, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    execution = sys.argv[4] if len(sys.argv) > 4 else "parallel"

    def log(line: str) -> None:
        with log_path.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    @tool
    def quick_lookup(key: str) -> str:
        """Fast."""
        log(f"quick {key}")
        return f"value of {key}"

    @tool
    def slow_report(topic: str) -> str:
        """Slow; hangs when HANG=1."""
        log("slow start")
        while os.environ.get("HANG") == "1":
            time.sleep(0.05)
        log("slow done")
        return f"report on {topic}"

    def final(messages):
        return AIMessage(
            "都查好了：" + "，".join(str(m.content) for m in messages if m.type == "tool")
        )

    batch = tool_calls(
        call("quick_lookup", "call-1", key="k"), call("slow_report", "call-2", topic="t")
    )
    script = {"start": [batch, final], "resume": [final], "new": [final]}[mode]
    config = LoopConfig(
        model=ScriptedChatModel(script=script),
        personas={"xilian": Persona(name="昔涟", instructions="你是昔涟。")},
        default_persona="xilian",
        tools=[quick_lookup, slow_report],
        tool_execution=execution,
    )
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
        model = config.model
        log(
            "sent "
            + " | ".join(
                f"{m.type}:{getattr(m, 'tool_call_id', '')}" for m in model.requests[-1].messages
            )
        )
    log("finished")


if __name__ == "__main__":
    main()
