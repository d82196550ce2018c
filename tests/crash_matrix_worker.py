"""One loop process of the crash matrix: run a turn, SIGKILL itself at a chosen point, or recover.

    python -m tests.crash_matrix_worker CHECKPOINT_URL DATA_DIR POINT start|recover|next|restart

POINT is where the `start` run kills itself with SIGKILL (a real `kill -9`,
not an exception): `node:<name>` right after that node's first update streams
(once background extractions settle), `reply` right after the final reply's
update (before the turn's extraction), `model` inside the first model call,
`tool` inside the second tool call,
`extraction` inside the background extractor after the reply returned.
`recover` starts fresh on the same thread: it resumes an interrupted turn
(if any), lets pending extractions finish, and writes a JSON report of what
it finds to DATA_DIR/report.json. `next` starts fresh too, but instead of
resuming it sends the owner's next message, as a user who never knew of the
crash would; `restart` only starts (`resume_extractions`) and reports, as for
a session that never speaks again. Every tool run and extractor run is
appended to DATA_DIR/events.log, so the parent can count them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from graph import (
    Compaction,
    LoopConfig,
    ModelView,
    Persona,
    SessionEnv,
    ToolCalls,
    TurnEnd,
    Vision,
    build_graph,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import MemoryItem, MemoryStore, Scope
from tests.scripted import ScriptedChatModel, call, tool_calls
from tests.workers_worker import turn_humans

THREAD = {"configurable": {"thread_id": os.environ.get("CRASH_THREAD", "matrix")}}
USER_TEXT = "帮我查两件事，记住我喜欢爬山"
MEMORY = "主人喜欢爬山"
NEXT_TEXT = "还有，记住我也喜欢游泳"
NEXT_MEMORY = "主人也喜欢游泳"
NEXT_REPLY = "好的，记住了"
MEMORY_OF = {"u1": MEMORY, "u2": NEXT_MEMORY}


def main() -> None:
    url, data, point, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    crashing = mode == "start"

    def event(line: str) -> None:
        with (data / "events.log").open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def die_at(here: str) -> None:
        if crashing and point == here:
            event(f"kill {here}")
            os.kill(os.getpid(), signal.SIGKILL)

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        event(f"tool start {key}")
        if key == "b":
            die_at("tool")
        event(f"tool done {key}")
        return f"value of {key}"

    def reply(messages: list[BaseMessage]) -> AIMessage:
        die_at("model")
        if any(m.id == "u2" for m in turn_humans(messages)):
            return AIMessage(NEXT_REPLY)
        if isinstance(messages[-1], ToolMessage):
            return AIMessage(
                "查好了：" + "，".join(str(m.content) for m in messages if m.type == "tool")
            )
        return tool_calls(call("lookup", "call-a", key="a"), call("lookup", "call-b", key="b"))

    class Extractor:
        background = True

        def extract(self, messages: list[BaseMessage]) -> list[MemoryItem]:
            event("extract")
            die_at("extraction")
            return [
                MemoryItem(content=MEMORY_OF[str(m.id)], kind="habit", scope=Scope.PERSONA)
                for m in turn_humans(messages)
            ]

    with MemoryStore.open(data / "memory") as store:
        config = LoopConfig(
            model=ScriptedChatModel(script=[reply] * 10),
            personas={"xilian": Persona(name="昔涟", instructions="你是昔涟。")},
            default_persona="xilian",
            tools=[lookup],
            memory=store,
            extractor=Extractor(),
            features=[
                ModelView(own_step=True),
                ToolCalls(execution="sequential"),
                Compaction(max_context_tokens=100_000),
                Vision(describer=lambda block: "一张图"),
                TurnEnd(hook=lambda user, assistant, persona: "平静"),
            ],
        )
        with open_checkpointer(url) as saver:
            graph = build_graph(config, saver)
            env = SessionEnv(actor="owner", persona_id="xilian")
            if crashing:
                turn = {"messages": [HumanMessage(USER_TEXT, id="u1")]}
                for update in graph.stream(turn, THREAD, context=env, stream_mode="updates"):
                    for node, values in update.items():
                        if point == f"node:{node}":
                            # A kill inside a running extraction is the `extraction`
                            # point's case; here the background work has settled.
                            wait_for_extractions(timeout=30)
                        die_at(f"node:{node}")
                        said = (values or {}).get("messages") or []
                        if node == "call_model" and said and not said[-1].tool_calls:
                            die_at("reply")
                wait_for_extractions(timeout=30)
                event("start finished")
                return
            resume_extractions(config, saver)
            if mode == "next":
                graph.invoke({"messages": [HumanMessage(NEXT_TEXT, id="u2")]}, THREAD, context=env)
            report(graph, env, store, data, resume=mode != "restart")


def report(graph: Any, env: SessionEnv, store: MemoryStore, data: Path, resume: bool) -> None:
    """Finish what the crash left (if `resume`), then describe the session for the parent."""
    if resume and graph.get_state(THREAD).next:
        graph.invoke(None, THREAD, context=env)
    wait_for_extractions(timeout=30)
    messages = graph.get_state(THREAD).values["messages"]
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    calls = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    out = {
        "kinds": [m.type for m in messages],
        "user_messages": [m.id for m in messages if isinstance(m, HumanMessage)],
        "unanswered": [c for c in calls if c not in answered],
        "final": messages[-1].content if messages else None,
        "memories": [i.content for i in store.list()].count(MEMORY),
        "next_memories": [i.content for i in store.list()].count(NEXT_MEMORY),
    }
    (data / "report.json").write_text(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
