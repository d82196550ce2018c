"""Property: whatever a model replies, the session keeps working (issue 11).

Hypothesis generates several turns of model replies — text, empty content,
valid, unparseable, cut-off, id-less and repeated-id tool calls — and runs
them through the real graph. Every request the model is then sent must be one
the OpenAI or Anthropic API accepts (checked with their own LangChain request
formatters, offline), every turn must finish, and no call of a cut-off reply
may ever run.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from graph import ModelView, ToolCalls, build_graph
from tests.conftest import human, make_config, owner
from tests.payload_checks import anthropic_problems, openai_problems, payload_problems
from tests.scripted import Request, ScriptedChatModel

MAX_ROUNDS = 3
RAN: list[str] = []


@tool
def remember(text: str) -> str:
    """Write something down."""
    RAN.append(text)
    return "ok"


class ReplayModel(ScriptedChatModel):
    """Answers from `queue` (one turn's generated replies), then with plain text."""

    queue: list[AIMessage] = Field(default_factory=list)

    def _next(self, messages: list, kwargs: dict[str, Any]) -> AIMessage:
        with self._lock:
            self._requests.append(Request(list(messages), dict(kwargs)))
            reply = self.queue.pop(0) if self.queue else AIMessage("好")
        return reply.model_copy(deep=True)


@dataclass(frozen=True)
class CallSpec:
    tool: str
    call_id: str | None


@dataclass(frozen=True)
class ReplySpec:
    text: str
    calls: tuple[CallSpec, ...]
    invalid: tuple[tuple[str | None, str | None], ...]  # (name, id)
    stop: dict[str, str] | None


CALL_IDS = st.sampled_from(["c1", "c2", None, "", "functions.remember:0", "call_" + "x" * 40])
FINISHED = [None, None, {"finish_reason": "stop"}]
CUT = [
    {"finish_reason": "length"},
    {"stop_reason": "max_tokens"},
    {"finish_reason": "MAX_TOKENS"},
    {"finish_reason": "content_filter"},  # stopped by the provider: never run either
    {"stop_reason": "refusal"},
]
STOPS = st.sampled_from([*FINISHED, *CUT])
REPLIES = st.builds(
    ReplySpec,
    text=st.sampled_from(["", "好的", "我来看看"]),
    calls=st.lists(
        st.builds(
            CallSpec, tool=st.sampled_from(["remember", "remember", "nope"]), call_id=CALL_IDS
        ),
        max_size=3,
    ).map(tuple),
    invalid=st.lists(st.tuples(st.sampled_from(["remember", None]), CALL_IDS), max_size=2).map(
        tuple
    ),
    stop=STOPS,
)
TURNS = st.lists(st.lists(REPLIES, max_size=MAX_ROUNDS), min_size=2, max_size=4)


def cut_off(spec: ReplySpec) -> bool:
    return spec.stop in CUT


def build_reply(spec: ReplySpec, tokens: itertools.count) -> AIMessage:
    """The reply a provider would hand LangChain; each call's argument is a unique token,
    marked `cut-` when the reply is cut off (such a call must never run)."""
    prefix = "cut" if cut_off(spec) else "run"
    calls = [
        {"name": c.tool, "args": {"text": f"{prefix}-{next(tokens)}"}, "id": c.call_id}
        for c in spec.calls
    ]
    invalid = [
        {"name": name, "args": '{"text": "半', "id": cid, "error": "Unterminated string"}
        for name, cid in spec.invalid
    ]
    return AIMessage(
        spec.text,
        tool_calls=calls,
        invalid_tool_calls=[{**c, "type": "invalid_tool_call"} for c in invalid],
        response_metadata=spec.stop or {},
    )


GRAPHS: dict[str, Any] = {}


LAYOUTS = {"round_first": {}, "cache": {"timezone": "UTC"}}
"""The cache layout with a time block, so every request ends with the round's own blocks."""


def graph_for(provider: str, layout: str) -> tuple[Any, ReplayModel]:
    """One graph per provider family and layout over an in-memory saver; each example uses
    new threads."""
    if (provider, layout) not in GRAPHS:
        model = ReplayModel(provider=provider)
        config = make_config(
            model,
            tools=[remember],
            retry=None,
            **LAYOUTS[layout],
            features=[ToolCalls(max_rounds=MAX_ROUNDS), ModelView(layout=layout)],
        )
        GRAPHS[provider, layout] = (build_graph(config, InMemorySaver()), model)
    return GRAPHS[provider, layout]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    provider=st.sampled_from(["openai", "anthropic"]),
    layout=st.sampled_from(list(LAYOUTS)),
    turns=TURNS,
)
def test_no_reply_breaks_a_session_or_sends_an_unanswered_call(provider, layout, turns):
    graph, model = graph_for(provider, layout)
    session = {"configurable": {"thread_id": str(uuid.uuid4())}}
    tokens = itertools.count()
    RAN.clear()
    first_request = len(model.requests)
    for n, replies in enumerate(turns):
        model.queue = [build_reply(spec, tokens) for spec in replies]
        graph.invoke({"messages": [human(f"第{n}句")]}, session, context=owner())
        state = graph.get_state(session)
        assert state.next == ()
        stored = state.values["messages"]
        assert payload_problems(provider, [*stored, HumanMessage("下一句")]) == []
    graph.invoke({"messages": [human("最后一句")]}, session, context=owner())

    for request in model.requests[first_request:]:
        assert payload_problems(provider, request.messages) == []
    assert not [t for t in RAN if t.startswith("cut-")], "a call of a cut-off reply ran"
    assert len(RAN) == len(set(RAN)), "a call ran twice"


@pytest.mark.parametrize("checker", [openai_problems, anthropic_problems])
def test_the_payload_checks_catch_an_unanswered_call_and_a_stray_result(checker):
    asked = AIMessage("", tool_calls=[{"name": "remember", "args": {"text": "a"}, "id": "c1"}])
    unanswered = [human("hi"), asked, human("again")]
    stray = [human("hi"), AIMessage("ok"), ToolMessage("x", tool_call_id="c9"), human("again")]
    answered = [human("hi"), asked, ToolMessage("ok", tool_call_id="c1"), human("again")]
    assert checker(unanswered) != []
    assert checker(stray) != []
    assert checker(answered) == []
