"""Provider portability: what each provider family is actually sent keeps the stored order.

The graph's view is recorded by the scripted model (reporting the provider
family), then turned into the real request payload by the provider's own
LangChain formatter — offline, no network.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, SystemMessage
from langchain_openai import ChatOpenAI

from graph import ModelView, Persona, SessionEnv, build_graph, open_checkpointer
from nodes.context.attribution import SPEAKER_SWITCH_MARKER
from nodes.context.encoding import NOTE_INDEX_HEADER, NOTE_POSITIONS_HEADER
from nodes.context.layout import (
    ROUND_STATE_CLOSE,
    ROUND_STATE_OPEN,
    is_loop_note,
    is_round_state,
)
from tests.conftest import human, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

GROUP = SessionEnv(actor="group")
THIRD = "以下发言来自「小明」——本会话里的第三方人员（非管理员账户），不是主人，也不是你说的。"
OWNER = "以下发言来自主人（管理员账户）本人，不是你说的，也不是本会话里的第三方人员。"
SELF = "以下发言来自你自己——「昔涟」（xilian）。"
NAMED = "以下发言来自「昔涟」（xilian）。"
"""The persona's note under "cache": it does not say whether that persona answers now."""
SPEAKING = "[会话角色] 你正以「昔涟」（xilian）的身份对话。"


class SingleSystemModel(ScriptedChatModel):
    """Like many local chat templates: one system message, first, or an error."""

    def _next(self, messages, kwargs):
        if any(isinstance(m, SystemMessage) for m in messages[1:]):
            raise ValueError("System message must be at the beginning")
        return super()._next(messages, kwargs)


def group_conversation(model, **overrides) -> list:
    """A group chat: third party, owner, a tool call by the persona; returns the last view."""
    script = [AIMessage("大家好"), tool_calls(call("get_time", "c1")), AIMessage("八点半")]
    model.script = script
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, restricted_tools={"get_time"}, **overrides), saver)
        graph.invoke({"messages": [human("hi", id="1", name="小明")]}, thread("g"), context=GROUP)
        graph.invoke({"messages": [human("几点了", id="2")]}, thread("g"), context=GROUP)
    return model.requests[-1].messages


STORED_ORDER = [
    ("human", "hi"),
    ("ai", "大家好"),
    ("human", "几点了"),
    ("ai", ""),
    ("tool", "08:30"),
]


def conversation_only(view) -> list:
    """The participants' messages: no system text, no note or round state the loop wrote."""
    return [
        (m.type, m.text)
        for m in view
        if not isinstance(m, SystemMessage) and not is_loop_note(m) and not is_round_state(m)
    ]


# Without a time block, working memory or memories, both layouts send the same order; under
# "cache" an Anthropic request also carries its `cache_control` marks.
LAYOUTS = pytest.mark.parametrize("layout", ["round_first", "cache"])


@LAYOUTS
def test_openai_compatible_gets_the_exact_inline_rendering(layout):
    view = group_conversation(
        ScriptedChatModel(provider="openai"), features=[ModelView(layout=layout)]
    )
    payload = ChatOpenAI(model="gpt-4o-mini", api_key="offline")._get_request_payload(view)
    sent = [(m["role"], m.get("content") or "") for m in payload["messages"]]
    persona = SPEAKER_SWITCH_MARKER + (SELF if layout == "round_first" else NAMED)
    assert sent[2:] == [
        ("system", SPEAKER_SWITCH_MARKER + THIRD),
        ("user", "hi"),
        ("system", persona),
        ("assistant", "大家好"),
        ("system", SPEAKER_SWITCH_MARKER + OWNER),
        ("user", "几点了"),
        ("system", persona),
        ("assistant", ""),
        ("tool", "08:30"),
        *([("system", SPEAKING)] if layout == "cache" else []),
    ]
    assert all("name" not in m for m in payload["messages"] if m["role"] == "user"), (
        "OpenAI rejects non-ASCII names; the notes carry attribution instead"
    )


@LAYOUTS
def test_anthropic_gets_one_system_prompt_and_the_stored_order(layout):
    view = group_conversation(
        ScriptedChatModel(provider="anthropic"), features=[ModelView(layout=layout)]
    )
    assert conversation_only(view) == STORED_ORDER
    assert [isinstance(m, SystemMessage) for m in view].count(True) == 1 and isinstance(
        view[0], SystemMessage
    )
    payload = ChatAnthropic(model="claude-sonnet-4-5", api_key="offline")._get_request_payload(view)
    system = (
        payload["system"] if isinstance(payload["system"], str) else payload["system"][0]["text"]
    )
    assert system.startswith(
        "你是昔涟。" if layout == "round_first" else "本会话可能由下列角色作答。"
    )
    roles = [m["role"] for m in payload["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    text = json.dumps(payload["messages"], ensure_ascii=False)
    assert text.index("hi") < text.index("大家好") < text.index("几点了") < text.index("08:30")
    notes = [THIRD, SELF, OWNER, SELF]
    if layout == "round_first":
        assert system.endswith(
            NOTE_INDEX_HEADER
            + "".join(
                f"\n第{n}条起：{SPEAKER_SWITCH_MARKER}{note}" for n, note in enumerate(notes, 1)
            )
        )
        assert SPEAKER_SWITCH_MARKER not in text, "attribution never enters user or assistant text"
        return
    # Under "cache" each note is a block of its own before its message, so the system prompt
    # stays the same as the group grows; the round state (last) says where they are.
    contents = [m["content"] for m in payload["messages"]]
    blocks = [
        b if isinstance(b, str) else b["text"]
        for content in contents
        for b in ([content] if isinstance(content, str) else content)
        if isinstance(b, str) or b["type"] == "text"
    ]
    assert blocks == [
        *(SPEAKER_SWITCH_MARKER + THIRD, "hi", SPEAKER_SWITCH_MARKER + NAMED, "大家好"),
        *(SPEAKER_SWITCH_MARKER + OWNER, "几点了", SPEAKER_SWITCH_MARKER + NAMED),
        f"{ROUND_STATE_OPEN}\n{SPEAKING}\n\n{NOTE_POSITIONS_HEADER}第1至4条\n{ROUND_STATE_CLOSE}",
    ]
    assert NOTE_INDEX_HEADER not in system


@LAYOUTS
@pytest.mark.parametrize(
    ("provider", "override"),
    [("ollama", "auto"), ("google_genai", "auto"), ("scripted", "leading")],
)
def test_single_system_models_get_the_leading_encoding(provider, override, layout):
    view = group_conversation(
        SingleSystemModel(provider=provider),
        features=[ModelView(attribution_encoding=override, layout=layout)],
    )
    assert conversation_only(view) == STORED_ORDER
    assert (
        isinstance(view[0], SystemMessage) and sum(isinstance(m, SystemMessage) for m in view) == 1
    )


def test_single_system_model_fails_with_inline_and_the_override_is_honoured():
    with pytest.raises(ValueError, match="System message must be at the beginning"):
        group_conversation(
            SingleSystemModel(provider="scripted"),
            features=[ModelView(attribution_encoding="inline")],
        )


def test_unlabelled_single_system_view_still_merges_leading_blocks():
    model = SingleSystemModel(provider="ollama", script=[AIMessage("ok")])
    build_graph(make_config(model, timezone="UTC")).invoke(
        {"messages": [human("hi")], "working_memory": "加班中"}, thread("u")
    )
    view = model.requests[0].messages
    assert [m.type for m in view] == ["system", "human"]
    assert view[0].content.split("\n\n") == [
        "你是昔涟。",
        "当前时间：2026-11-29 08:30（星期日，UTC）",
        "工作记忆: 加班中",
    ]


def test_knobs_reach_the_real_request_payloads():
    openai = ChatOpenAI(model="o4-mini", api_key="offline")
    model = ScriptedChatModel(provider="openai", script=[AIMessage("ok")])
    personas = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", reasoning_effort="high")}
    build_graph(make_config(model, personas=personas)).invoke(
        {"messages": [human("hi")]}, thread("k")
    )
    request = model.requests[0]
    assert (
        openai._get_request_payload(request.messages, **request.kwargs)["reasoning_effort"]
        == "high"
    )

    anthropic = ChatAnthropic(model="claude-sonnet-4-5", api_key="offline")
    model = ScriptedChatModel(provider="anthropic", script=[AIMessage("ok")])
    personas = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", thinking_budget=2048)}
    build_graph(make_config(model, personas=personas)).invoke(
        {"messages": [human("hi")]}, thread("k")
    )
    request = model.requests[0]
    payload = anthropic._get_request_payload(request.messages, **request.kwargs)
    assert payload["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def knob_kwargs(profile: dict | None, turns: int = 1, **persona: Any) -> list[dict]:
    """What an OpenAI-family model with `profile` is sent, turn by turn, for a persona
    asking for reasoning_effort="low" (and `persona`'s other fields)."""
    model = ScriptedChatModel(provider="openai", profile=profile, script=[AIMessage("ok")] * turns)
    xilian = Persona(name="昔涟", instructions="你是昔涟。", reasoning_effort="low", **persona)
    graph = build_graph(make_config(model, personas={"xilian": xilian}))
    for turn in range(turns):
        graph.invoke({"messages": [human("hi", id=f"h{turn}")]}, thread("k"))
    return [request.kwargs for request in model.requests]


def test_a_model_whose_profile_does_not_reason_gets_no_knobs_logged_once(caplog):
    with caplog.at_level("WARNING", logger="cyrene.thinking"):
        sent = knob_kwargs({"reasoning_output": False}, turns=2)
    assert [kwargs.get("reasoning_effort") for kwargs in sent] == [None, None]
    assert [r.getMessage() for r in caplog.records] == [
        "not sending reasoning_effort to scripted: it takes no thinking knobs "
        "(model_accepts_thinking, else its LangChain profile's reasoning_output); "
        "model_accepts_thinking=True sends them anyway"
    ]


@pytest.mark.parametrize(
    ("profile", "accepts", "sent"),
    [
        ({"reasoning_output": True}, None, "low"),
        (None, None, "low"),  # no profile: sent as asked
        ({"reasoning_output": False}, True, "low"),
        ({"reasoning_output": True}, False, None),
    ],
)
def test_the_persona_decides_over_the_profile(profile, accepts, sent):
    kwargs = knob_kwargs(profile, model_accepts_thinking=accepts)[0]
    assert kwargs.get("reasoning_effort") == sent
