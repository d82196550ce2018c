"""Token accounting (issue 20): each model call's `usage_metadata`, per call, per turn and per
session, in the state's `token_usage`; `cyrene history` prints the session's totals.

The expected totals are added up here by hand from the scripted usage, not with the
code under test.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph import Fallbacks, Guards, KeywordGuard, build_graph, open_checkpointer
from tests.cli_support import cyrene
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel, call
from tests.test_provider_failures import fast_retries, openai_status, rate_limit


def usage(input_tokens: int, output_tokens: int, cached: int | None = None) -> dict:
    reported = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    if cached is not None:
        reported["input_token_details"] = {"cache_read": cached}
    return reported


def said(text: str, used: dict, **fields) -> AIMessage:
    return AIMessage(text, usage_metadata=used, **fields)


def asked(call_id: str, used: dict) -> AIMessage:
    return AIMessage("", tool_calls=[call("get_time", call_id)], usage_metadata=used)


U1, U2, U3, U4 = usage(100, 10), usage(120, 5, cached=100), usage(140, 20, cached=120), usage(90, 7)
TURNS = [["早"], ["几点了"], ["晚安"]]
SCRIPT = [said("早安", U1), asked("c1", U2), said("八点半", U3), said("晚安", U4)]
CALLS_PER_TURN = [[U1], [U2, U3], [U4]]


def total(calls: list[dict]) -> dict:
    summed = {
        key: sum(c[key] for c in calls) for key in ("input_tokens", "output_tokens", "total_tokens")
    }
    cached = [c["input_token_details"]["cache_read"] for c in calls if "input_token_details" in c]
    if cached:
        summed["input_token_details"] = {"cache_read": sum(cached)}
    return summed


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_totals_over_a_scripted_session_equal_the_sum_of_the_scripted_usage(tmp_path, mode):
    model = ScriptedChatModel(script=SCRIPT)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    seen = []
    for n, (text,) in enumerate(TURNS):
        turn = {"messages": [HumanMessage(text, id=f"m{n}")]}
        if mode == "sync":
            with open_checkpointer(url) as saver:
                out = build_graph(make_config(model), saver).invoke(turn, thread("s"))
        else:
            async with open_checkpointer(url) as saver:
                out = await build_graph(make_config(model), saver).ainvoke(turn, thread("s"))
        seen.append(out["token_usage"])
    for n, record in enumerate(seen):
        assert record["turn_id"] == f"m{n}"
        assert record["calls"] == CALLS_PER_TURN[n]
        assert record["turn"] == total(CALLS_PER_TURN[n])
        assert record["session"] == total([c for calls in CALLS_PER_TURN[: n + 1] for c in calls])
    assert seen[-1]["session"] == {
        "input_tokens": 450,
        "output_tokens": 42,
        "total_tokens": 492,
        "input_token_details": {"cache_read": 220},
    }
    assert [m.usage_metadata for m in out["messages"] if m.type == "ai"] == [U1, U2, U3, U4], (
        "each reply keeps its own call's usage"
    )


def test_a_provider_that_reports_nothing_shows_nothing():
    model = ScriptedChatModel(script=[AIMessage("早安"), AIMessage("好")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        graph.invoke({"messages": [HumanMessage("早")]}, thread("n"))
        graph.invoke({"messages": [HumanMessage("在吗")]}, thread("n"))
        assert "token_usage" not in graph.get_state(thread("n")).values


def test_a_turn_that_reports_nothing_does_not_show_the_last_turns_usage():
    model = ScriptedChatModel(script=[said("早安", U1), AIMessage("好")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        graph.invoke({"messages": [HumanMessage("早", id="a")]}, thread("m"))
        out = graph.invoke({"messages": [HumanMessage("在吗", id="b")]}, thread("m"))
    assert out["token_usage"] == {"turn_id": "b", "calls": [], "session": U1}


def failing(make):
    """A script step whose call fails with `make()` (it reports no usage)."""

    def reply(messages):
        raise make()

    return reply


def test_retried_and_fallback_calls_count_once_each():
    """Turn 1's second round fails twice with a 429 (LangGraph retries the node) before it
    answers; turn 2's model fails for good and a fallback answers. Each answer counts once."""
    primary = ScriptedChatModel(
        script=[
            asked("c1", U1),
            failing(rate_limit),
            failing(rate_limit),
            said("八点半", U2),
            failing(lambda: openai_status(400)),
        ]
    )
    fallback = ScriptedChatModel(script=[said("备用", U3)])
    config = make_config(primary, **fast_retries(2), features=[Fallbacks(models=[fallback])])
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        first = graph.invoke({"messages": [HumanMessage("几点了", id="a")]}, thread("r"))
        second = graph.invoke({"messages": [HumanMessage("再说一次", id="b")]}, thread("r"))
    assert (len(primary.requests), len(fallback.requests)) == (5, 1)
    assert first["token_usage"]["calls"] == [U1, U2]
    assert second["messages"][-1].content == "备用" and second["token_usage"]["calls"] == [U3]
    assert second["token_usage"]["session"] == total([U1, U2, U3])


def test_a_reply_a_guard_replaces_still_counts():
    model = ScriptedChatModel(script=[said("密码是 1234", U1)])
    config = make_config(model, features=[Guards(checks=[KeywordGuard(["密码"])])])
    out = build_graph(config).invoke({"messages": [HumanMessage("早")]}, thread("g"))
    assert out["messages"][-1].content != "密码是 1234"
    assert out["token_usage"]["session"] == U1, "the call happened and was billed"


def test_streamed_replies_are_counted_too():
    model = ScriptedChatModel(script=[said("早安", U2)], stream_chunks=True)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        turn = {"messages": [HumanMessage("早")]}
        chunks = list(graph.stream(turn, thread("s"), stream_mode="messages"))
        assert len(chunks) > 2, "the reply streamed in pieces"
        assert graph.get_state(thread("s")).values["token_usage"]["session"] == U2


def test_cyrene_history_prints_the_sessions_totals(tmp_path, capsys):
    data = ["--data", str(tmp_path), "--session", "s1"]
    model = ScriptedChatModel(script=[said("早安", U2), said("晚安", U4)])
    assert cyrene(capsys, "run", "早", *data, model=model).code == 0
    assert cyrene(capsys, "run", "晚安", *data, model=model).code == 0
    lines = cyrene(capsys, "history", "s1", "--data", str(tmp_path)).out.splitlines()
    assert [line.split(maxsplit=1)[0] for line in lines] == ["human", "ai(xilian)"] * 2 + ["tokens"]
    assert lines[-1].split(maxsplit=1)[1] == "input 210 (cached 100)  output 12  total 222"

    silent = ScriptedChatModel(script=[AIMessage("好")])
    assert (
        cyrene(capsys, "run", "早", "--session", "s2", "--data", str(tmp_path), model=silent).code
        == 0
    )
    lines = cyrene(capsys, "history", "s2", "--data", str(tmp_path)).out.splitlines()
    assert [line.split()[0] for line in lines] == ["human", "ai(xilian)"], (
        "nothing reported: no line"
    )
