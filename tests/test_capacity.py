"""Capacity tiers and the restricted-session tool policy, with their events."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from graph import (
    AuditEvent,
    CapacityPolicy,
    SessionEnv,
    Tier,
    ToolCalls,
    build_graph,
    open_checkpointer,
)
from graph.sinks import JsonlSink
from tests.conftest import human, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

RUNS: list[str] = []


@tool
def clock() -> str:
    """Time."""
    RUNS.append("clock")
    return "08:30"


@tool
def web_search(query: str) -> str:
    """Search the web."""
    RUNS.append("web_search")
    return f"results for {query}"


@tool
def send_email(to: str) -> str:
    """Send an email."""
    RUNS.append("send_email")
    return f"sent to {to}"


@tool
def calculator(expr: str) -> str:
    """Ungated tool."""
    RUNS.append("calculator")
    return "42"


POLICY = CapacityPolicy(
    tiers=(
        Tier(name="base", tools=("clock",)),
        Tier(name="research", tools=("web_search",), triggers=("搜索", "re:\\bsearch\\b")),
        Tier(name="mail", tools=("send_email",), triggers=("邮件",), decay_turns=1),
    )
)


@pytest.fixture(autouse=True)
def _reset_runs():
    RUNS.clear()


def capacity_config(model, events=None, features=()):
    return make_config(
        model,
        tools=[clock, web_search, send_email, calculator],
        restricted_tools={"clock"},
        features=[
            POLICY.model_copy(update={"on_event": events.append if events is not None else None}),
            *features,
        ],
    )


def test_advertised_tools_follow_awake_tiers_round_by_round():
    events = []
    model = ScriptedChatModel(
        script=[
            AIMessage("好"),
            tool_calls(call("web_search", "c1", query="猫")),
            AIMessage("找到了"),
            AIMessage("好"),
        ]
    )
    with open_checkpointer("memory") as saver:
        graph = build_graph(capacity_config(model, events=events), saver)
        graph.invoke({"messages": [human("你好")]}, thread("a"))
        graph.invoke({"messages": [human("帮我搜索一下猫")]}, thread("a"))
        graph.invoke({"messages": [human("谢谢")]}, thread("a"))
        state = graph.get_state(thread("a")).values
    assert [r.tool_names for r in model.requests] == [
        ["clock", "calculator"],
        ["clock", "web_search", "calculator"],
        ["clock", "web_search", "calculator"],
        ["clock", "web_search", "calculator"],
    ]
    assert [(e.kind, e.tier, e.reason, e.turn, e.session_id) for e in events] == [
        ("capacity_awaken", "base", "start", 1, "a"),
        ("capacity_awaken", "research", "trigger", 2, "a"),
    ]
    assert state["capacity"] == {"base": 1, "research": 2}


def test_a_sleeping_tools_call_still_runs_in_owner_sessions_and_wakes_its_tier():
    events = []
    model = ScriptedChatModel(
        script=[tool_calls(call("send_email", "c1", to="boss")), AIMessage("发了")]
    )
    out = build_graph(capacity_config(model, events=events)).invoke(
        {"messages": [human("发给老板")]}, thread("u")
    )
    assert RUNS == ["send_email"]
    assert model.requests[0].tool_names == ["clock", "calculator"]
    assert model.requests[1].tool_names == ["clock", "send_email", "calculator"]
    assert ("capacity_awaken", "mail", "use") in [(e.kind, e.tier, e.reason) for e in events]
    assert out["messages"][-1].content == "发了"


def test_decay_puts_a_tier_back_to_sleep():
    events = []
    model = ScriptedChatModel(script=[AIMessage("ok")] * 4)
    with open_checkpointer("memory") as saver:
        graph = build_graph(capacity_config(model, events=events), saver)
        for text in ("写封邮件", "嗯", "嗯", "嗯"):
            graph.invoke({"messages": [human(text)]}, thread("d"))
    assert ["send_email" in r.tool_names for r in model.requests] == [True, True, False, False]
    assert [(e.kind, e.tier, e.reason, e.turn) for e in events][-1] == (
        "capacity_sleep",
        "mail",
        "decay",
        3,
    )


def test_awake_tiers_persist_per_session_and_do_not_leak():
    model = ScriptedChatModel(script=[AIMessage("ok")] * 3)
    with open_checkpointer("memory") as saver:
        graph = build_graph(capacity_config(model), saver)
        graph.invoke({"messages": [human("搜索一下")]}, thread("one"))
        graph.invoke({"messages": [human("你好")]}, thread("two"))
    with open_checkpointer("memory") as other_saver:
        build_graph(capacity_config(model), other_saver).invoke(
            {"messages": [human("你好")]}, thread("one")
        )
    assert ["web_search" in r.tool_names for r in model.requests] == [True, False, False]


def test_awake_tiers_survive_a_new_process(tmp_path):
    url = f"sqlite:///{tmp_path}/cap.db"
    first = ScriptedChatModel(script=[AIMessage("ok")])
    with open_checkpointer(url) as saver:
        build_graph(capacity_config(first), saver).invoke(
            {"messages": [human("search cats")]}, thread("p")
        )
    second = ScriptedChatModel(script=[AIMessage("ok")])
    with open_checkpointer(url) as saver:
        build_graph(capacity_config(second), saver).invoke(
            {"messages": [human("then?")]}, thread("p")
        )
    assert "web_search" in second.requests[0].tool_names


def test_capacity_events_reach_the_custom_stream():
    model = ScriptedChatModel(script=[AIMessage("ok")])
    graph = build_graph(capacity_config(model))
    custom = [
        c for c in graph.stream({"messages": [human("搜索")]}, thread("s"), stream_mode="custom")
    ]
    assert [(c["kind"], c["tier"]) for c in custom] == [
        ("capacity_awaken", "base"),
        ("capacity_awaken", "research"),
    ]


@pytest.mark.parametrize("actor", ["group", "stranger"])
def test_restricted_sessions_deny_and_audit_even_when_the_model_insists(actor, tmp_path):
    audits: list[AuditEvent] = []
    sink = JsonlSink(tmp_path / "audit.jsonl")
    insist = [
        tool_calls(call("send_email", f"c{i}", to="x"), call("clock", f"k{i}")) for i in range(3)
    ]
    model = ScriptedChatModel(script=[*insist, AIMessage("好吧")])

    def both(event):
        audits.append(event)
        sink(event)

    graph = build_graph(capacity_config(model, features=[ToolCalls(on_audit=both)]))
    chunks = list(
        graph.stream(
            {"messages": [human("发邮件 搜索", id="in-1", name="小明")]},
            thread("r"),
            context=SessionEnv(actor=actor, persona_id="aglaea"),
            stream_mode=["custom", "values"],
        )
    )
    custom = [c for mode, c in chunks if mode == "custom" and c.get("kind") == "audit_tool_denied"]
    final = [c for mode, c in chunks if mode == "values"][-1]["messages"]
    assert RUNS == ["clock"] * 3, "the denied tool never ran; the restricted tool did"
    assert all(r.tool_names == ["clock"] for r in model.requests), (
        "only restricted tools are advertised"
    )
    denied = [m for m in final if isinstance(m, ToolMessage) and m.name == "send_email"]
    assert len(denied) == 3 and all(
        m.status == "error" and "not_allowed" in m.content for m in denied
    )
    assert [(a.tool, a.actor, a.persona_id, a.session_id, a.turn_id) for a in audits] == [
        ("send_email", actor, "xilian", "r", "in-1")
    ] * 3
    assert audits[0].arguments == {"to": "x"} and audits[0].time > 0
    assert len(custom) == 3 and custom[0]["tool"] == "send_email"
    assert [line["tool_call_id"] for line in sink.read()] == ["c0", "c1", "c2"]


def test_hooks_cannot_lift_the_restricted_boundary():
    from graph import ToolHooks

    model = ScriptedChatModel(
        script=[tool_calls(call("send_email", "c1", to="x")), AIMessage("ok")]
    )
    hooks = ToolHooks(before_call=lambda c, env: None)
    build_graph(capacity_config(model, features=[ToolCalls(hooks=hooks)])).invoke(
        {"messages": [human("发邮件", name="小明")]}, thread("h"), context=SessionEnv(actor="group")
    )
    assert RUNS == []


def test_without_capacity_every_tool_is_advertised():
    model = ScriptedChatModel(script=[AIMessage("ok")])
    build_graph(make_config(model, tools=[clock, web_search, send_email])).invoke(
        {"messages": [human("hi")]}, thread("n")
    )
    assert model.requests[0].tool_names == ["clock", "web_search", "send_email"]
