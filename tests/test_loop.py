"""The loop's turn: personas, knobs, thinking, guards, round cap, mood, sync and async."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from graph import (
    Compaction,
    Guards,
    KeywordGuard,
    ManualExtractor,
    ModelView,
    Persona,
    SessionEnv,
    Thinking,
    ToolCalls,
    TurnEnd,
    Vision,
    build_graph,
    open_checkpointer,
)
from memory import MemoryStore
from nodes.core.stages import LOOP_NODES
from tests.conftest import human, make_config, owner, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


def first_system(request) -> str:
    return request.messages[0].content


@pytest.mark.parametrize(
    ("env", "prompt"),
    [
        (SessionEnv(), "你是昔涟。"),
        (SessionEnv(persona_id="aglaea"), "你是阿格莱雅。"),
        (SessionEnv(persona_id="nobody"), "你是昔涟。"),
        (SessionEnv(actor="group", persona_id="aglaea"), "你是昔涟。"),
        (SessionEnv(actor="stranger", persona_id="aglaea"), "你是昔涟。"),
        (SessionEnv(actor="internal", persona_id="aglaea"), "你是阿格莱雅。"),
    ],
)
def test_persona_prompt_is_always_the_first_message(env, prompt):
    model = ScriptedChatModel(script=[AIMessage("好")])
    build_graph(make_config(model)).invoke({"messages": [human("hi")]}, thread("p"), context=env)
    assert first_system(model.requests[0]) == prompt


def test_replies_are_labelled_with_the_persona_except_in_restricted_sessions():
    model = ScriptedChatModel(script=[AIMessage("a"), AIMessage("b")])
    graph = build_graph(make_config(model))
    owner_out = graph.invoke({"messages": [human("hi")]}, thread("o"), context=owner("aglaea"))
    group_out = graph.invoke(
        {"messages": [human("hi", name="小明")]}, thread("g"), context=SessionEnv(actor="group")
    )
    assert owner_out["messages"][-1].name == "aglaea"
    assert group_out["messages"][-1].name is None


def test_persona_switch_on_one_thread_attributes_earlier_replies():
    model = ScriptedChatModel(script=[AIMessage("早安，我是昔涟"), AIMessage("我是阿格莱雅")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        graph.invoke({"messages": [human("早", id="m1")]}, thread("s"), context=owner("xilian"))
        out = graph.invoke(
            {"messages": [human("你是谁", id="m2")]}, thread("s"), context=owner("aglaea")
        )
    sent = [(m.type, m.content) for m in model.requests[1].messages]
    assert sent[0] == ("system", "你是阿格莱雅。")
    assert ("system", "[发言归属] 以下发言来自「昔涟」（xilian），不是你说的。") in sent
    assert (
        sent.index(("system", "[发言归属] 以下发言来自「昔涟」（xilian），不是你说的。"))
        == sent.index(("ai", "早安，我是昔涟")) - 1
    )
    assert [m.name for m in out["messages"] if m.type == "ai"] == ["xilian", "aglaea"]


@pytest.mark.parametrize(
    ("provider", "persona", "expected"),
    [
        ("openai", Persona(reasoning_effort="high"), {"reasoning_effort": "high"}),
        (
            "anthropic",
            Persona(thinking_budget=2048),
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
        ),
        ("ollama", Persona(reasoning_effort="low"), {"reasoning": "low"}),
        ("google_genai", Persona(thinking_budget=512), {"thinking_budget": 512}),
        ("mystery", Persona(reasoning_effort="high", thinking_budget=99), {}),
    ],
)
def test_persona_knobs_reach_the_model_call_in_the_provider_spelling(provider, persona, expected):
    model = ScriptedChatModel(script=[AIMessage("ok")], provider=provider)
    config = make_config(model, personas={"p": persona}, default_persona="p", tools=[])
    build_graph(config).invoke({"messages": [human("hi")]}, thread("k"))
    assert model.requests[0].kwargs == expected


def test_loop_wide_knobs_apply_when_the_persona_sets_none():
    model = ScriptedChatModel(script=[AIMessage("ok")], provider="openai")
    config = make_config(model, tools=[], features=[Thinking(reasoning_effort="medium")])
    build_graph(config).invoke({"messages": [human("hi")]}, thread("k"))
    assert model.requests[0].kwargs == {"reasoning_effort": "medium"}


THOUGHT = {"type": "reasoning", "reasoning": "先想一想主人的问题"}


@pytest.mark.parametrize("show", [False, True])
def test_thinking_is_kept_out_of_the_stream_but_not_the_transcript(show):
    reply = AIMessage([THOUGHT, {"type": "text", "text": "你好呀"}])
    model = ScriptedChatModel(script=[reply], stream_chunks=True)
    personas = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", show_thinking=show)}
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, personas=personas), saver)
        chunks = [
            c
            for c, meta in graph.stream(
                {"messages": [human("hi")]}, thread("t"), stream_mode="messages"
            )
            if isinstance(c, AIMessageChunk)
        ]
        stored = graph.get_state(thread("t")).values["messages"][-1]
    streamed_types = [
        b.get("type") for c in chunks if isinstance(c.content, list) for b in c.content
    ]
    streamed_text = "".join(
        b.get("text", "") for c in chunks if isinstance(c.content, list) for b in c.content
    )
    assert streamed_text == "你好呀"
    assert len(chunks) >= 3, "the reply is streamed token by token, not in one piece"
    assert ("reasoning" in streamed_types) is show
    assert [b["reasoning"] for b in stored.content if b["type"] == "reasoning"] == [
        THOUGHT["reasoning"]
    ]
    assert stored.id == chunks[0].id


def test_request_guard_blocks_before_the_model_and_hides_the_text_forever():
    model = ScriptedChatModel(script=[AIMessage("好的")])
    guard = KeywordGuard(["炸弹"], responses=False)
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(model, features=[Guards(checks=[guard], refusal_text="不行哦")]), saver
        )
        first = graph.invoke({"messages": [human("教我做炸弹", id="bad")]}, thread("g"))
        graph.invoke({"messages": [human("那聊点别的", id="ok")]}, thread("g"))
    assert first["messages"][-1].content == "不行哦"
    assert [m.content for m in first["messages"]] == ["教我做炸弹", "不行哦"], (
        "nothing the user said is lost"
    )
    assert len(model.requests) == 1, "the blocked turn never called the model"
    sent = " ".join(str(m.content) for m in model.requests[0].messages)
    assert "炸弹" not in sent and "不行哦" not in sent


def test_response_guard_keeps_the_blocked_reply_from_the_user_and_the_transcript():
    model = ScriptedChatModel(script=[AIMessage("秘密是 hunter2")], stream_chunks=True)
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(
                model, features=[Guards(checks=[KeywordGuard(["hunter2"])], refusal_text="不能说")]
            ),
            saver,
        )
        streamed = [
            c
            for c, _ in graph.stream(
                {"messages": [human("密码？")]}, thread("r"), stream_mode="messages"
            )
        ]
        stored = graph.get_state(thread("r")).values["messages"]
    assert all("hunter2" not in str(c.content) for c in streamed)
    assert [m.content for m in stored] == ["密码？", "不能说"]


def test_a_guard_that_raises_blocks():
    class Broken(KeywordGuard):
        def check_request(self, text):
            raise RuntimeError("guard down")

    model = ScriptedChatModel(script=[AIMessage("never")])
    out = build_graph(
        make_config(model, features=[Guards(checks=[Broken([])], refusal_text="稍后再试")])
    ).invoke({"messages": [human("hi")]}, thread("b"))
    assert out["messages"][-1].content == "稍后再试" and model.requests == []


def test_tool_failures_come_back_to_the_model_as_error_results():
    script = [
        tool_calls(
            call("explode", "c1", reason="disk"),
            call("add", "c2", a="x", b=1),
            call("teleport", "c3"),
        ),
        AIMessage("我看到错误了"),
    ]
    model = ScriptedChatModel(script=script)
    out = build_graph(make_config(model)).invoke({"messages": [human("do it")]}, thread("e"))
    results = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert {r.status for r in results.values()} == {"error"}
    assert "boom: disk" in results["c1"].content
    assert "valid integer" in results["c2"].content
    assert "teleport is not a valid tool" in results["c3"].content
    assert out["messages"][-1].content == "我看到错误了"


def test_round_cap_answers_the_last_rounds_calls_without_running_them():
    runs = []

    from langchain_core.tools import tool

    @tool
    def ping() -> str:
        """Ping."""
        runs.append(1)
        return "pong"

    model = ScriptedChatModel(script=[tool_calls(call("ping", f"c{i}")) for i in range(5)])
    out = build_graph(make_config(model, tools=[ping], features=[ToolCalls(max_rounds=3)])).invoke(
        {"messages": [human("go")]}, thread("r")
    )
    assert len(model.requests) == 3
    assert len(runs) == 2
    last = out["messages"][-1]
    assert (
        isinstance(last, ToolMessage)
        and last.tool_call_id == "c2"
        and last.content.startswith("round_limit")
    )
    ai_calls = [c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    answered = [m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)]
    assert ai_calls == answered, "no dangling tool call"


def test_mood_from_on_turn_end_is_recorded_on_the_final_reply_and_in_state():
    seen = []

    def on_turn_end(user_text, assistant_text, persona):
        seen.append((user_text, assistant_text, persona))
        return {"valence": 0.8, "label": "开心"}

    model = ScriptedChatModel(script=[tool_calls(call("get_time", "c1")), AIMessage("八点半啦")])
    out = build_graph(make_config(model, features=[TurnEnd(hook=on_turn_end)])).invoke(
        {"messages": [human("几点了")]}, thread("m"), context=owner("aglaea")
    )
    assert seen == [("几点了", "八点半啦", "aglaea")]
    assert out["mood"] == {"valence": 0.8, "label": "开心"}
    assert out["messages"][-1].response_metadata["cyrene"]["mood"] == {
        "valence": 0.8,
        "label": "开心",
    }


def test_a_failing_turn_end_hook_does_not_fail_the_turn():
    def on_turn_end(*_):
        raise RuntimeError("mood engine down")

    model = ScriptedChatModel(script=[AIMessage("好")])
    out = build_graph(make_config(model, features=[TurnEnd(hook=on_turn_end)])).invoke(
        {"messages": [human("hi")]}, thread("m")
    )
    assert out["messages"][-1].content == "好" and out["mood"] is None


def test_working_memory_and_transform_context_shape_the_view():
    calls = []

    def transform(messages, round_):
        calls.append(round_)
        return [m for m in messages if m.content != "drop me"]

    model = ScriptedChatModel(script=[tool_calls(call("get_time", "c1")), AIMessage("ok")])
    build_graph(make_config(model, features=[ModelView(transform=transform)])).invoke(
        {"messages": [human("drop me"), human("keep")], "working_memory": "主人在加班"}, thread("w")
    )
    assert calls == [1, 2]
    assert [m.content for m in model.requests[0].messages] == [
        "你是昔涟。",
        "工作记忆: 主人在加班",
        "keep",
    ]


async def test_sync_and_async_paths_produce_the_same_transcript():
    def script():
        return [tool_calls(call("add", "c1", a=2, b=3)), AIMessage("是5")]

    sync_model, async_model = (
        ScriptedChatModel(script=script()),
        ScriptedChatModel(script=script() * 2),
    )
    sync_out = build_graph(make_config(sync_model)).invoke(
        {"messages": [human("2+3", id="q")]}, thread("s")
    )
    graph = build_graph(make_config(async_model))
    async_out = await graph.ainvoke({"messages": [human("2+3", id="q")]}, thread("a"))
    updates = [
        u
        async for u in graph.astream(
            {"messages": [human("2+3")]}, thread("b"), stream_mode="updates"
        )
    ]

    shape = [(m.type, m.content) for m in sync_out["messages"]]
    assert shape == [("human", "2+3"), ("ai", ""), ("tool", "5"), ("ai", "是5")]
    assert [(m.type, m.content) for m in async_out["messages"]] == shape
    assert [next(iter(u)) for u in updates] == ["call_model", "dispatch_tools", "call_model"]
    assert [r.texts for r in sync_model.requests] == [r.texts for r in async_model.requests[:2]]


@pytest.mark.parametrize("view_step", [True, False])
def test_stages_that_are_on_run_in_the_designed_order(tmp_path, view_step):
    model = ScriptedChatModel(script=[tool_calls(call("add", "c1", a=1, b=1)), AIMessage("2")])
    every_stage = make_config(
        model,
        memory=MemoryStore.open(tmp_path / "memory"),
        extractor=ManualExtractor(),
        features=[
            ModelView(own_step=view_step),
            Compaction(max_context_tokens=10_000),
            Vision(describer=lambda block: "图"),
            TurnEnd(hook=lambda *_: "calm"),
        ],
    )
    graph = build_graph(every_stage)
    updates = [next(iter(u)) for u in graph.stream({"messages": [human("1+1")]}, thread("o"))]
    stages = [
        "resolve_vision", "compact", "assemble_context", "call_model", "dispatch_tools",
        "compact", "assemble_context", "call_model", "extract_memory", "finish_turn",
    ]  # fmt: skip
    # Without the view step, call_model compacts and assembles the view itself.
    folded = ("compact", "assemble_context")
    assert updates == (stages if view_step else [s for s in stages if s not in folded])
    assert len(model.requests) == 2, "with or without its own step, one view per model call"
    drawn = set(build_graph(make_config(model)).get_graph().nodes)
    assert set(LOOP_NODES) <= drawn, "stages that are off are still drawn"


def test_a_failing_transform_context_is_logged_and_the_view_goes_untransformed(caplog):
    def transform(messages, round_):
        raise RuntimeError("projection bug")

    model = ScriptedChatModel(script=[AIMessage("ok")])
    out = build_graph(make_config(model, features=[ModelView(transform=transform)])).invoke(
        {"messages": [human("hi")]}, thread("x")
    )
    assert out["messages"][-1].content == "ok"
    assert [m.content for m in model.requests[0].messages] == ["你是昔涟。", "hi"]
    assert "ModelView.transform failed" in caplog.text


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
async def test_hidden_thinking_works_without_streaming(asynchronous):
    reply = AIMessage([THOUGHT, {"type": "text", "text": "你好呀"}])
    personas = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", show_thinking=False)}
    graph = build_graph(make_config(ScriptedChatModel(script=[reply]), personas=personas))
    turn = {"messages": [human("hi")]}
    out = await graph.ainvoke(turn) if asynchronous else graph.invoke(turn)
    assert out["messages"][-1].content == reply.content, "the transcript keeps the thinking"
