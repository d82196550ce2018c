"""Importable history (issue 23): the application may bring a conversation with tool rounds
into a session with `Trusted`, as long as every call is answered by its result."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from graph import SessionEnv, Trusted, build_graph, open_checkpointer
from tests.boundary_support import endless
from tests.conftest import make_config, thread
from tests.payload_checks import payload_problems


def history(rounds: int) -> list:
    """`rounds` exchanges of 5 messages: a question, a call, its result, the answer, a note."""
    messages: list = []
    for n in range(rounds):
        messages += [
            HumanMessage(f"第{n}个问题", id=f"h{n}"),
            AIMessage(
                "",
                tool_calls=[{"name": "add", "args": {"a": n, "b": 1}, "id": f"call_{n}"}],
                id=f"a{n}",
            ),
            ToolMessage(str(n + 1), tool_call_id=f"call_{n}", name="add", id=f"t{n}"),
            AIMessage(f"答案是{n + 1}", name="xilian", id=f"r{n}"),
            SystemMessage(f"备注{n}", id=f"s{n}"),
        ]
    return messages


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_200_message_history_with_tool_rounds_imports_and_the_next_turn_renders(provider):
    model = endless(provider)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        imported = history(40)
        graph.invoke(Trusted({"messages": [*imported[:-1], HumanMessage("导入完毕")]}), thread("i"))
        graph.invoke({"messages": [HumanMessage("刚才第3个问题的答案是多少？")]}, thread("i"))
        stored = graph.get_state(thread("i")).values["messages"]
    assert len(imported) == 200
    assert [m.id for m in stored[:199]] == [m.id for m in imported[:199]]
    assert stored[2].tool_call_id == "call_0" and stored[1].tool_calls[0]["args"] == {
        "a": 0,
        "b": 1,
    }
    assert len(model.requests) == 2
    for request in model.requests:
        assert payload_problems(provider, request.messages) == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_history_imported_twice_is_sent_with_each_call_id_once(provider):
    model = endless(provider)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        for copy in ("x", "y"):  # the application's own ids, the same call ids both times
            imported = [m.model_copy(update={"id": f"{copy}{m.id}"}) for m in history(2)[:-1]]
            graph.invoke(Trusted({"messages": imported}), thread("twice"))
        graph.invoke({"messages": [HumanMessage("在吗")]}, thread("twice"))
        graph.invoke({"messages": [HumanMessage("还在吗")]}, thread("twice"))
        stored = graph.get_state(thread("twice")).values["messages"]
    *_, first, second = (request.messages for request in model.requests)
    calls = [c["id"] for m in first if isinstance(m, AIMessage) for c in m.tool_calls]
    results = [m.tool_call_id for m in first if isinstance(m, ToolMessage)]
    assert calls[:2] == ["call_0", "call_1"] and len(set(calls)) == 4 and results == calls
    assert payload_problems(provider, first) == []
    assert second[: len(first)] == first, "the same ids every round: the cached prefix holds"
    assert [c["id"] for m in stored if isinstance(m, AIMessage) for c in m.tool_calls] == [
        "call_0",
        "call_1",
    ] * 2, "the transcript keeps what was imported"


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
                HumanMessage("hi"),
            ],
            r"messages\[0\]: tool call 'c1' has no result before messages\[1\]",
        ),
        (
            [
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
                AIMessage("嗯"),
                ToolMessage("1", tool_call_id="c1"),
                HumanMessage("hi"),
            ],
            r"tool call 'c1' has no result before messages\[1\]",
        ),
        (
            [
                HumanMessage("hi"),
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
            ],
            r"messages\[1\]: tool call 'c1' has no result$",
        ),
        (
            [ToolMessage("1", tool_call_id="c9"), HumanMessage("hi")],
            r"tool result for 'c9' answers no call before it",
        ),
        (
            [
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "functions.add:0"}]),
                ToolMessage("1", tool_call_id="functions.add:0"),
                HumanMessage("hi"),
            ],
            r"call id 'functions.add:0' is not \[A-Za-z0-9_-\]\{1,40\}",
        ),
        (
            [
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
                ToolMessage("1", tool_call_id="c1"),
                AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
                ToolMessage("1", tool_call_id="c1"),
                HumanMessage("hi"),
            ],
            r"tool call id 'c1' is used twice",
        ),
    ],
    ids=[
        "human before result",
        "reply before result",
        "unanswered at the end",
        "stray result",
        "unusable id",
        "repeated id",
    ],
)
def test_an_import_that_leaves_a_call_unanswered_is_refused_naming_it(messages, error):
    model = endless("openai")
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        with pytest.raises(ValueError, match=error):
            graph.invoke(Trusted({"messages": messages}), thread("x"), context=SessionEnv())
        assert graph.get_state(thread("x")).values.get("messages", []) == []
    assert model.requests == []


def test_only_the_application_may_import_calls():
    model = endless("openai")
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        with pytest.raises(ValueError, match="AIMessage cannot be turn input"):
            graph.invoke({"messages": [*history(1)[:4], HumanMessage("hi")]}, thread("u"))
