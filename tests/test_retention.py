"""Checkpoint retention: pruning keeps the latest checkpoints and every word of the transcript."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from graph import build_graph, open_checkpointer, prune_checkpoints
from nodes.kernel.compat import DeltaChannel
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

# Four transcript updates a turn (input, tool call, tool result, reply): 27
# turns pass LangGraph's own snapshot at 100 updates, so the kept checkpoints'
# transcript is rebuilt from a snapshot plus the writes after it.
TURNS = 27


def companion(replies: int = 400) -> ScriptedChatModel:
    """Asks for the time, then answers with it: the same reply for the same transcript."""

    def reply(messages: list[BaseMessage]) -> AIMessage:
        said = [m for m in messages if m.type != "system"]
        if said[-1].type == "tool":
            return AIMessage(f"现在{said[-1].content}，你说了{len(said)}条")
        return tool_calls(call("get_time", f"t{sum(m.type == 'human' for m in said)}"))

    return ScriptedChatModel(script=[reply] * replies)


def turn(graph: Any, session: str, n: int) -> None:
    graph.invoke(
        {"messages": [HumanMessage(f"第{n}句：几点了？", id=f"{session}-{n}")]}, thread(session)
    )


def said(messages: list[BaseMessage]) -> list[tuple]:
    """What a transcript says, without the ids LangChain generates per run."""
    return [(m.type, m.content, getattr(m, "tool_call_id", None)) for m in messages]


def transcript(graph: Any, session: str) -> list[BaseMessage]:
    return graph.get_state(thread(session)).values["messages"]


def checkpoints(saver: Any, session: str) -> int:
    return sum(1 for _ in saver.list(thread(session)))


def last_requests(model: ScriptedChatModel, n: int) -> list[tuple]:
    return [(r.texts, r.tool_names) for r in model.requests[-n:]]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/checkpoints.db"
    return request.getfixturevalue("postgres_url")


def sessions(*names: str) -> list[str]:
    """Names unique to this test: Postgres is shared by every test, and other runs."""
    tag = uuid.uuid4().hex[:8]
    return [f"{name}-{tag}" for name in names]


def test_pruning_keeps_the_transcript_and_the_next_turn(url):
    pruned, control = sessions("pruned", "control")
    model = companion()
    with open_checkpointer(url) as saver:
        graph = build_graph(make_config(model), saver)
        for n in range(TURNS):
            turn(graph, pruned, n)
            turn(graph, control, n)
        for keep, n in ((5, TURNS), (3, TURNS + 1)):  # prune, talk, prune again, talk
            before = [m.model_dump() for m in transcript(graph, pruned)]
            control_count = checkpoints(saver, control)

            report = prune_checkpoints(saver, keep=keep, thread_ids=[pruned])

            assert report.sessions == 1 and report.checkpoints_deleted > 0
            assert [m.model_dump() for m in transcript(graph, pruned)] == before
            assert checkpoints(saver, pruned) == keep
            assert checkpoints(saver, control) == control_count, "other sessions are untouched"
            history = list(graph.get_state_history(thread(pruned)))
            control_history = list(graph.get_state_history(thread(control)))[:keep]
            assert [said(s.values["messages"]) for s in history] == [
                said(s.values["messages"]) for s in control_history
            ], "every kept checkpoint still reads its own full state"
            assert [s.next for s in history] == [s.next for s in control_history]

            turn(graph, pruned, n)
            turn(graph, control, n)
            assert last_requests(model, 4)[:2] == last_requests(model, 2), (
                "the model sees the same request with or without pruning"
            )
            assert said(transcript(graph, pruned)) == said(transcript(graph, control))


class Crash(BaseException):
    """The process dying inside a tool (no `except Exception` stops it)."""


def test_an_interrupted_turn_resumes_after_pruning(url):
    [session] = sessions("crash")
    runs: list[str] = []
    crashing = [True]

    @tool
    def quick(key: str) -> str:
        """Fast."""
        runs.append("quick")
        return f"value of {key}"

    @tool
    def fragile(topic: str) -> str:
        """Dies the first time."""
        runs.append("fragile")
        if crashing[0]:
            raise Crash
        return f"report on {topic}"

    def final(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(
            "查好了：" + "，".join(str(m.content) for m in messages if m.type == "tool")
        )

    batch = tool_calls(call("quick", "q1", key="k"), call("fragile", "f1", topic="t"))
    model = ScriptedChatModel(script=[AIMessage("早")] * 3 + [batch, final])
    with open_checkpointer(url) as saver:
        graph = build_graph(make_config(model, tools=[quick, fragile]), saver)
        for n in range(3):
            turn(graph, session, n)
        with pytest.raises(Crash):
            turn(graph, session, 3)
        assert graph.get_state(thread(session)).next == ("dispatch_tools",)

        prune_checkpoints(saver, keep=1, thread_ids=[session])

        assert checkpoints(saver, session) == 1
        crashing[0] = False
        out = graph.invoke(None, thread(session))
    # The batch's two calls run at once, so which one starts first is the scheduler's choice.
    assert runs.count("quick") == 1, "the finished call's saved result is kept"
    assert runs.count("fragile") == 2 and runs[-1] == "fragile", "only the crashed call runs again"
    assert said(out["messages"])[-5:] == [
        ("human", "第3句：几点了？", None),
        ("ai", "", None),
        ("tool", "value of k", "q1"),
        ("tool", "report on t", "f1"),
        ("ai", "查好了：value of k，report on t", None),
    ]
    assert [m.content for m in out["messages"] if m.type == "human"] == [
        f"第{n}句：几点了？" for n in range(4)
    ], "the turns before the cut are still in the transcript"


def append_all(current: list, writes: list[list]) -> list:
    return current + [item for write in writes for item in write]


class Notes(TypedDict):
    notes: Annotated[list, DeltaChannel(append_all)]


def notes_graph(saver: Any) -> Any:
    """Another graph's session in the same database, with a delta channel the loop doesn't know."""
    graph = StateGraph(Notes)
    graph.add_node("note", lambda state: {"notes": [len(state["notes"])]})
    graph.add_edge(START, "note")
    graph.add_edge("note", END)
    return graph.compile(checkpointer=saver)


def test_prune_every_session_shrinks_the_file_and_leaves_foreign_sessions_whole(tmp_path):
    db = tmp_path / "checkpoints.db"
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(make_config(companion()), saver)
        for n in range(TURNS):
            turn(graph, "a", n)
            turn(graph, "b", n)
        turn(graph, "short", 0)
        notes = notes_graph(saver)
        for _ in range(5):
            notes.invoke({"notes": [-1]}, thread("notes"))
        before = {s: said(transcript(graph, s)) for s in ("a", "b", "short")}
        short_count, notes_count = checkpoints(saver, "short"), checkpoints(saver, "notes")
        notes_before = notes.get_state(thread("notes")).values["notes"]
        size_before = db.stat().st_size

        report = prune_checkpoints(saver, keep=6)

        assert report.sessions == 2 and report.skipped == ("notes",)
        assert {s: said(transcript(graph, s)) for s in before} == before
        assert [checkpoints(saver, s) for s in ("a", "b")] == [6, 6]
        assert checkpoints(saver, "short") == short_count, "a session within `keep` is untouched"
        assert checkpoints(saver, "notes") == notes_count
        assert notes.get_state(thread("notes")).values["notes"] == notes_before
    assert db.stat().st_size < size_before / 2, "VACUUM gives the space back to the disk"
    assert "pruned 2 session(s)" in str(report) and "notes" in str(report)


def test_prune_refuses_what_it_cannot_do_safely(tmp_path):
    with (
        open_checkpointer(f"sqlite:///{tmp_path}/c.db") as saver,
        pytest.raises(ValueError, match="at least its latest checkpoint"),
    ):
        prune_checkpoints(saver, keep=0)
    with pytest.raises(TypeError, match="SqliteSaver and PostgresSaver"):
        prune_checkpoints(InMemorySaver())
