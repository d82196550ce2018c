"""The transcript reducer's shortcut for appended steps changes nothing: for any closed
transcript and any writes (new messages, re-sent ids, id collisions across kinds,
removals, chunks, dangling tool calls) it returns what the plain definition
(`add_messages`, `kept_apart`, `close_interrupted_calls` over the whole list) returns,
and it stays batching-invariant as `DeltaChannel` requires."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langgraph.graph.message import add_messages

from nodes.core.reducers import kept_apart, merge_transcript, only_new_messages
from nodes.kernel.transcript import close_interrupted_calls

IDS = [f"m{i}" for i in range(8)]
CALL_IDS = ["c1", "c2", "c3"]


def defined(current: list[BaseMessage], writes: list[list[BaseMessage]]) -> list[BaseMessage]:
    """The reducer as its docstring states it, with no shortcut."""
    batch = [m for write in writes for m in write]
    return close_interrupted_calls(add_messages(current, kept_apart(current, batch)))


@st.composite
def messages(draw: st.DrawFn, existing: list[str]) -> BaseMessage:
    """A write; removals only where `existing` names what they may remove."""
    kind = draw(st.sampled_from(["human", "ai", "calls", "tool", "chunk", "remove"]))
    id_ = draw(st.sampled_from([*IDS, f"new-{draw(st.integers(0, 3))}"]))
    if kind == "remove":
        return (
            RemoveMessage(id=draw(st.sampled_from(existing)))
            if existing
            else HumanMessage("x", id=id_)
        )
    if kind == "human":
        return HumanMessage(draw(st.sampled_from(["你好", "在吗"])), id=id_)
    if kind == "ai":
        return AIMessage("嗯", id=id_)
    if kind == "chunk":
        return AIMessageChunk(content="片", id=id_)
    calls = draw(st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=2, unique=True))
    if kind == "calls":
        return AIMessage("", id=id_, tool_calls=[{"id": c, "name": "t", "args": {}} for c in calls])
    return ToolMessage("ok", tool_call_id=calls[0], id=id_)


@st.composite
def cases(
    draw: st.DrawFn, removals: bool = True
) -> tuple[list[BaseMessage], list[list[BaseMessage]]]:
    seed = draw(st.lists(messages([]), max_size=6))
    current = defined([], [seed])
    existing = [m.id for m in current if m.id] if removals else []
    writes = draw(st.lists(st.lists(messages(existing), min_size=1, max_size=3), max_size=3))
    removed = [m.id for write in writes for m in write if isinstance(m, RemoveMessage)]
    assume(len(removed) == len(set(removed)))  # a second removal of an id fails in add_messages
    return current, writes


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_reducer_returns_what_its_definition_returns(case):
    current, writes = case
    assert merge_transcript(current, writes) == defined(current, writes)


def ids_kept(current: list[BaseMessage], writes: list[list[BaseMessage]]) -> bool:
    """Replies and results keep what their id says, as the loop's stable ids guarantee:
    an id never passes from one kind of reply or result to another, and a reply
    rewritten under its id (the mood on a final reply) keeps its calls. Human
    messages may collide with anything: the reducer moves those collisions."""
    seen: dict[str | None, tuple] = {}
    for message in [*current, *(m for write in writes for m in write)]:
        if isinstance(message, HumanMessage):
            continue
        if isinstance(message, AIMessage):  # chunks too
            shape: tuple = ("ai", *(c["id"] for c in message.tool_calls))
        else:
            shape = (message.type,)
        if seen.setdefault(message.id, shape) != shape:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(cases(removals=False))  # add_messages itself folds a removal and a re-add differently
def test_folding_writes_one_by_one_or_at_once_gives_the_same_transcript(case):
    current, writes = case
    assume(ids_kept(current, writes))
    one_by_one = current
    for write in writes:
        one_by_one = merge_transcript(one_by_one, [write])
    assert merge_transcript(current, writes) == one_by_one


def test_what_the_user_said_and_what_the_loop_answered_never_overwrite_each_other():
    said = HumanMessage("几点了", id="m1")
    asked = AIMessage("", id="m1", tool_calls=[{"id": "c1", "name": "t", "args": {}}])
    answered = ToolMessage("八点", tool_call_id="c1", id="m1")
    merged = merge_transcript([said], [[asked], [answered]])
    assert [(m.type, m.id) for m in merged] == [
        ("human", "m1"),
        ("ai", "m1#ai"),
        ("tool", "m1#tool"),
    ]
    rewritten = asked.model_copy(update={"content": "查一下"})
    again = merge_transcript(merged, [[rewritten]])
    assert [m.content for m in again] == ["几点了", "查一下", "八点"], "lands on the moved copy"
    resent = merge_transcript(again, [[HumanMessage("几点了？", id="m1")]])
    assert [m.content for m in resent] == ["几点了？", "查一下", "八点"], "a re-send still replaces"


def test_a_moved_id_that_the_other_side_holds_too_is_moved_again():
    current = [HumanMessage("a", id="m1"), HumanMessage("b", id="m1#ai")]
    merged = merge_transcript(current, [[AIMessage("嗯", id="m1")]])
    assert [(m.type, m.id, m.content) for m in merged] == [
        ("human", "m1", "a"), ("human", "m1#ai", "b"), ("ai", "m1#ai#ai", "嗯"),
    ]  # fmt: skip


def test_the_shortcut_is_taken_for_an_ordinary_step_and_only_then():
    current = [HumanMessage("你好", id="h1"), AIMessage("嗯", id="a1")]
    assert only_new_messages(current, [HumanMessage("在吗", id="h2")])
    assert not only_new_messages(current, [HumanMessage("你好", id="h1")]), "a re-sent message"
    assert not only_new_messages(current, [HumanMessage("在吗")]), "no id yet"
    assert not only_new_messages(current, [RemoveMessage(id="a1")])
    assert not only_new_messages(current, [AIMessageChunk(content="片", id="c")])
    twice = [AIMessage("一", id="x"), AIMessage("二", id="x")]
    assert not only_new_messages(current, twice), "one id twice in a step"


def test_a_step_that_answers_with_a_new_message_closes_the_calls_it_left_open():
    asked = AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "t", "args": {}}])
    merged = merge_transcript(
        [HumanMessage("查", id="h1"), asked], [[HumanMessage("算了", id="h2")]]
    )
    assert [(m.type, m.id) for m in merged] == [
        ("human", "h1"), ("ai", "a1"), ("tool", "interrupted-c1"), ("human", "h2"),
    ]  # fmt: skip
