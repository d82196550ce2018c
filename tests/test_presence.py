"""Group-chat presence with the scripted model: answered when addressed, quiet otherwise, and
every quiet message heard by the next answer, with its speaker."""

from __future__ import annotations

import importlib

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph import (
    Compaction,
    GroupPresence,
    LLMReplyJudge,
    LoopConfig,
    Persona,
    ReplyScorer,
    SessionEnv,
    TurnEnd,
    Vision,
    build_graph,
    open_checkpointer,
)
from nodes.context.summary import SUMMARY_PREFIX
from nodes.presence.policy import quiet_reason
from studio.demo.conversation import SUNSET_PNG
from tests.conftest import PERSONAS, make_config, thread
from tests.scripted import ScriptedChatModel, call

NICKNAMED = {**PERSONAS, "xilian": PERSONAS["xilian"].model_copy(update={"nicknames": ("小昔",)})}
GROUP = SessionEnv(actor="group")
NOTE = (
    "[发言归属] 以下发言来自「{}」——本会话里的第三方人员（非管理员账户），不是主人，也不是你说的。"
)


def replies(count: int = 10) -> ScriptedChatModel:
    return ScriptedChatModel(script=[AIMessage("嗯嗯。")] * count)


def group_graph(saver, model, features=(), **overrides):
    config = make_config(
        model, personas=NICKNAMED, features=[GroupPresence(reply="mentioned")], **overrides
    )
    return build_graph(config.with_features(*features), saver)


def say(graph, session: str, text: str, name: str | None, env: SessionEnv = GROUP, **kwargs):
    return graph.invoke(
        {"messages": [HumanMessage(text, name=name)]}, thread(session), context=env, **kwargs
    )


@pytest.mark.parametrize(
    ("text", "env", "reason"),
    [
        ("昔涟你觉得呢？", GROUP, "mentioned 昔涟"),
        ("哈哈小昔说得对", GROUP, "mentioned 小昔"),
        ("你觉得呢？", SessionEnv(actor="group", mentioned=True), "the platform flagged a mention"),
    ],
    ids=["name", "nickname", "platform flag"],
)
def test_a_turn_that_addresses_the_persona_is_answered(text, env, reason):
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model)
        quiet = say(graph, "g", "今天天气不错", "小明")
        answered = say(graph, "g", text, "小红", env)
    assert quiet_reason(quiet) == "not addressed (no name, nickname or platform mention)"
    assert quiet["messages"][-1].content == "今天天气不错", "stored, and nothing after it"
    assert len(model.requests) == 1, "the quiet turn called no model"
    assert answered["messages"][-1].content == "嗯嗯。" and answered["presence"]["reason"] == reason


def test_a_display_name_that_imitates_the_persona_addresses_nobody():
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model)
        for name in ("昔涟", "小昔", "小昔昔"):
            assert quiet_reason(say(graph, "g", "大家好", name)) is not None
        assert quiet_reason(say(graph, "g", "小昔昔你好呀", "小红")) is None, (
            "the room's names never decide: the text names 小昔 (issue 28 finding 5)"
        )
    assert len(model.requests) == 1


def test_quiet_messages_reach_the_next_answer_in_order_with_their_speakers():
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model)
        for text, name in (("周末去爬山吗？", "小明"), ("好啊", "小红"), ("我也去", None)):
            say(graph, "g", text, name)
        state = say(graph, "g", "昔涟也来吧", "小明")
    [request] = model.requests
    conversation = [
        (kind, text) for kind, text in request.texts if not text.startswith("[会话角色]")
    ]
    assert conversation[1:] == [
        ("system", NOTE.format("小明")),
        ("human", "周末去爬山吗？"),
        ("system", NOTE.format("小红")),
        ("human", "好啊"),
        (
            "system",
            "[发言归属] 以下发言来自主人（管理员账户）本人，不是你说的，也不是本会话里的第三方人员。",
        ),
        ("human", "我也去"),
        ("system", NOTE.format("小明")),
        ("human", "昔涟也来吧"),
    ]
    stored = [(m.type, m.name) for m in state["messages"]]
    assert stored == [
        ("human", "小明"),
        ("human", "小红"),
        ("human", None),
        ("human", "小明"),
        ("ai", None),
    ]


def test_owner_and_stranger_chats_always_answer():
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model, features=[GroupPresence(reply="judged")])
        owner = say(graph, "o", "今天天气不错", None, SessionEnv(actor="owner"))
        stranger = say(graph, "s", "今天天气不错", "路人", SessionEnv(actor="stranger"))
    assert len(model.requests) == 2
    assert "presence" not in owner and "presence" not in stranger
    assert owner["messages"][-1].name == "xilian" and stranger["messages"][-1].content == "嗯嗯。"


def test_a_quiet_turn_runs_no_stage_no_tool_and_no_extraction_but_the_turn_end_hook():
    described, ended = [], []
    model = ScriptedChatModel(
        script=[AIMessage("", tool_calls=[call("get_time", "c1")]), AIMessage("八点半")]
    )
    photo = [
        {"type": "text", "text": "看这张"},
        {"type": "image", "base64": SUNSET_PNG, "mime_type": "image/png"},
    ]

    def describe(block):
        described.append(block)
        return "一张图"

    with open_checkpointer("memory") as saver:
        graph = group_graph(
            saver,
            model,
            restricted_tools={"get_time"},
            features=[
                Compaction(max_context_tokens=4000),
                Vision(describer=describe, model_accepts_images=False),
                TurnEnd(hook=lambda user, reply, persona: ended.append((user, reply)) or "平静"),
            ],
        )
        chunks = list(
            graph.stream(
                {"messages": [HumanMessage(photo, name="小明")]},
                thread("g"),
                context=GROUP,
                stream_mode=["updates", "custom"],
            )
        )
        assert described == [] and model.requests == [], "no vision call, no model call"
        state = say(graph, "g", "昔涟，现在几点？", "小红")
    updates = [list(c) for mode, c in chunks if mode == "updates"]
    assert updates == [["call_model"]], "the decision ends a quiet turn: no reply, no turn-end hook"
    [event] = [c for mode, c in chunks if mode == "custom"]
    assert event["kind"] == "presence" and event["reply"] is False
    assert [user for user, _ in ended] == ["昔涟，现在几点？"], (
        "the hook hears the answered turn only"
    )
    assert len(described) == 1, "the answered turn folded the quiet message's image"
    assert "一张图" in str(model.requests[0].messages), "and the model saw its description"
    assert [m.type for m in state["messages"]] == ["human", "human", "ai", "tool", "ai"]
    assert "pending_extractions" not in state


def test_judged_with_the_offline_scorer():
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model, features=[GroupPresence(reply="judged")])
        for text in ("好累", "哈哈", "我先吃饭了"):
            assert quiet_reason(say(graph, "g", text, "小明")) is not None
        asked = say(graph, "g", "有人周末去爬山吗？", "小红")
        mentioned = say(graph, "g", "小昔在吗", "小红")
    assert asked["presence"]["reason"].startswith("score 0.59 ≥ 0.5"), asked["presence"]
    assert mentioned["presence"]["reason"] == "mentioned 小昔"
    assert len(model.requests) == 2


def verdict(reply: bool, reason: str) -> AIMessage:
    return AIMessage("", tool_calls=[call("Decision", "d1", reply=reply, reason=reason)])


def test_an_llm_judge_decides_before_the_main_model():
    judge_model = ScriptedChatModel(
        script=[verdict(False, "they are chatting"), verdict(True, "a question to all")]
    )
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(
            saver, model, features=[GroupPresence(reply="judged", judge=LLMReplyJudge(judge_model))]
        )
        quiet = say(graph, "g", "哈哈", "小明")
        answered = say(graph, "g", "这题怎么做？", "小红")
        mentioned = say(graph, "g", "昔涟？", "小红")
    assert quiet_reason(quiet) == "judge: they are chatting"
    assert answered["presence"]["reason"] == "judge: a question to all"
    assert mentioned["presence"]["reason"] == "mentioned 昔涟", "a mention asks no judge"
    assert len(judge_model.requests) == 2 and len(model.requests) == 2
    assert judge_model.requests[1].messages[-1].content == "小明：哈哈\n小红：这题怎么做？"


def test_a_failing_judge_falls_back_to_the_scorer():
    judge_model = ScriptedChatModel(script=[])  # every call fails
    with open_checkpointer("memory") as saver:
        graph = group_graph(
            saver,
            replies(),
            features=[GroupPresence(reply="judged", judge=LLMReplyJudge(judge_model))],
        )
        state = say(graph, "g", "哈哈", "小明")
    assert quiet_reason(state).startswith("judge failed (AssertionError); score 0.06 < 0.5")


def test_the_demo_model_can_be_the_judge():
    """The demo model answers a forced tool choice (structured output) with a call of that
    tool, so `LLMReplyJudge(DemoChatModel())` decides instead of falling back."""
    from studio.demo.model import DemoChatModel

    with open_checkpointer("memory") as saver:
        graph = group_graph(
            saver,
            replies(),
            features=[GroupPresence(reply="judged", judge=LLMReplyJudge(DemoChatModel()))],
        )
        chatting = say(graph, "g", "哈哈", "小明")
        asking = say(graph, "g", "这题怎么做？", "小红")
    assert quiet_reason(chatting) == "judge: （演示模型）"
    assert asking["presence"] == {
        **asking["presence"],
        "reply": True,
        "reason": "judge: （演示模型）",
    }


async def test_a_quiet_turn_on_the_async_path():
    model = replies()
    async with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model)
        quiet = await graph.ainvoke(
            {"messages": [HumanMessage("哈哈", name="小明")]}, thread("a"), context=GROUP
        )
        answered = await graph.ainvoke(
            {"messages": [HumanMessage("昔涟在吗", name="小明")]}, thread("a"), context=GROUP
        )
    assert quiet_reason(quiet) is not None and answered["messages"][-1].content == "嗯嗯。"
    assert len(model.requests) == 1


def test_the_settings_refuse_what_would_silently_do_nothing():
    with pytest.raises(ValueError, match="reply"):
        LoopConfig(model=replies(), features=[GroupPresence(reply="sometimes")])
    with pytest.raises(ValueError, match="judge: only used with reply='judged'"):
        LoopConfig(model=replies(), features=[GroupPresence(judge=ReplyScorer())])
    with pytest.raises(ValueError, match="nicknames: expected a list of names, not a string"):
        Persona(nicknames="小昔")
    with pytest.raises(ValueError, match=r"nicknames\[1\]: expected a non-blank name"):
        Persona(nicknames=("小昔", "  "))


def test_studios_graph_shows_the_decision_as_a_node_update(tmp_path, monkeypatch):
    monkeypatch.setenv("CYRENE_DATA", str(tmp_path))
    # The module builds the server's graph when it is imported: over tmp_path, here.
    studio_graph = importlib.import_module("studio.graph")
    config = studio_graph.make_config(features=[GroupPresence(reply="mentioned")])
    try:
        graph = studio_graph.make_graph(config)
        quiet = list(
            graph.stream(
                {"messages": [HumanMessage("大家好", name="小明")]},
                stream_mode="updates",
                context=GROUP,
            )
        )
    finally:
        config.memory.close()
    assert [list(update) for update in quiet] == [["call_model"]]
    decision = quiet[0]["call_model"]["presence"]
    assert decision["reply"] is False and decision["reason"].startswith("not addressed")


def test_quiet_messages_past_the_budget_reach_the_answer_folded_with_their_speakers():
    model = replies()
    with open_checkpointer("memory") as saver:
        graph = group_graph(saver, model, features=[Compaction(max_context_tokens=300)])
        for i in range(12):
            say(graph, "g", f"第{i}条：今天的会议纪要在群文件里，大家记得看一下。", f"成员{i % 3}")
        say(graph, "g", "昔涟，会议纪要在哪？", "小明")
    [request] = model.requests
    summary = next(text for kind, text in request.texts if SUMMARY_PREFIX in text)
    assert "- 「成员0」：第0条" in summary, (
        "the earliest quiet message is in the summary, by speaker"
    )
    humans = [text for kind, text in request.texts if kind == "human"]
    assert 1 < len(humans) < 13, "the latest quiet messages stay whole; the rest is folded"
    assert humans[-2:] == [
        "第11条：今天的会议纪要在群文件里，大家记得看一下。",
        "昔涟，会议纪要在哪？",
    ]
