"""The busy policies: a message that arrives while its session runs a turn.

`merge` answers a burst with one turn, each message keeping its speaker;
`enqueue` gives each its own turn, in arrival order; `reject` refuses at once.
Under each, a waiting caller can time out, a merged caller's stream yields the
final state, and a merged turn that fails still answers everyone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph import (
    GroupPresence,
    SessionBusyError,
    SessionEnv,
    Sessions,
    SessionWaitTimeout,
    build_graph,
    open_checkpointer,
)
from graph.runs import NothingToResumeError
from graph.sessions import queued
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel
from tests.test_sessions import HeldTurn, answers, echo, stored_humans, until


@pytest.fixture
def held() -> Iterator[HeldTurn]:
    """A held first turn on an in-memory saver (released at the end, whatever happened)."""
    with open_checkpointer("memory") as saver:
        turn = HeldTurn(saver)
        yield turn
        turn.end()


# -- a burst of group messages during a turn -------------------------------------------


GROUP = SessionEnv(actor="group")


def while_held(held: HeldTurn, graph, name: str, sends: list[Callable[[], object]]) -> None:
    """Each send on a thread of its own while the held turn runs, queued in this order;
    then the held turn ends, and every send is waited for."""
    workers = []
    for i, send in enumerate(sends, start=1):
        worker = threading.Thread(target=send)
        worker.start()
        workers.append(worker)
        until(lambda i=i: queued(graph, name) == i)  # arrival order is the order sent
    held.end()
    for worker in workers:
        worker.join()


def burst(graph, held: HeldTurn, name: str):
    """One turn starts; five group members write while it runs; then it finishes."""
    results: dict[str, object] = {}

    def send(message: HumanMessage) -> None:
        try:
            results[message.id] = graph.invoke({"messages": [message]}, thread(name), context=GROUP)
        except Exception as exc:
            results[message.id] = exc

    held.begin(graph, name, HumanMessage("先说一句", id="m0", name="甲"), send=send)
    messages = [HumanMessage(f"插话{i}", id=f"m{i}", name=f"成员{i}") for i in range(1, 6)]
    while_held(held, graph, name, [partial(send, m) for m in messages])
    return results


def test_merge_answers_a_burst_once_with_each_speaker_kept(held):
    model, graph = held.model, held.graph()  # merge is the default
    results = burst(graph, held, "g")
    stored = stored_humans(graph, "g")
    assert len(model.requests) == 2, "the turn that ran, then one turn for the whole burst"
    assert [(m.id, m.name) for m in stored] == [("m0", "甲")] + [
        (f"m{i}", f"成员{i}") for i in range(1, 6)
    ]
    merged = model.requests[1].texts
    for i in range(1, 6):
        assert ("human", f"插话{i}") in merged
        assert any(kind == "system" and f"成员{i}" in text for kind, text in merged), (
            "each speaker keeps its attribution note"
        )
    for message_id, state in results.items():
        assert isinstance(state, dict) and answers(state, message_id), message_id
    assert len({results[f"m{i}"]["messages"][-1].content for i in range(1, 6)}) == 1, (
        "the merged callers share one answer"
    )


def test_enqueue_answers_each_message_in_its_own_turn_in_arrival_order(held):
    model, graph = held.model, held.graph(features=[Sessions(busy_policy="enqueue")])
    results = burst(graph, held, "q")
    stored = stored_humans(graph, "q")
    assert len(model.requests) == 6
    assert [r.messages[-1].content for r in model.requests[1:]] == [
        f"插话{i}" for i in range(1, 6)
    ], "one turn per message, in arrival order"
    assert [m.id for m in stored] == [f"m{i}" for i in range(6)]
    for message_id, state in results.items():
        assert isinstance(state, dict)
        assert [m for m in state["messages"] if m.type == "human"][-1].id == message_id
        assert state["messages"][-1].type == "ai", "the state right after its own turn"


def test_only_calls_with_the_same_context_merge(held):
    """A burst for one persona and a message for another in between (a session is one
    actor: issue 28, so the contexts differ in persona): the first persona's messages
    share a turn, the other's gets one of its own, in arrival order."""
    model, graph = held.model, held.graph()
    sent = [
        ("a", None, SessionEnv(persona_id="xilian")),
        ("b", None, SessionEnv(persona_id="aglaea")),
        ("c", None, SessionEnv(persona_id="xilian")),
    ]
    held.begin(graph, "mix", HumanMessage("先", id="0"))
    while_held(
        held,
        graph,
        "mix",
        [
            partial(
                graph.invoke,
                {"messages": [HumanMessage(f"消息{message_id}", id=message_id, name=name)]},
                thread("mix"),
                context=env,
            )
            for message_id, name, env in sent
        ],
    )
    stored = [m.id for m in stored_humans(graph, "mix")]
    turns = [[m.content for m in r.messages if m.type == "human"][-2:] for r in model.requests[1:]]
    assert turns == [["消息a", "消息c"], ["消息c", "消息b"]], "a and c in one turn, then b"
    assert stored == ["0", "a", "c", "b"]


def test_when_a_merged_turn_fails_the_other_callers_still_get_answers(held):
    """The caller running the merged turn gets the model's error; the turn is saved
    part-way, and a merged caller resumes it to get its own answer."""
    calls = {"n": 0}

    def flaky(messages) -> AIMessage:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("provider down")
        return echo(messages)

    model = held.model = ScriptedChatModel(script=[held.model.script[0], flaky, flaky, echo])
    graph = held.graph()
    results = burst(graph, held, "f")
    stored = [m.id for m in stored_humans(graph, "f")]
    errors = [i for i, r in results.items() if isinstance(r, Exception)]
    assert errors == ["m1"], "the caller whose turn failed sees the failure"
    assert isinstance(results["m1"], RuntimeError)
    for message_id in ("m0", "m2", "m3", "m4", "m5"):
        assert answers(results[message_id], message_id), message_id
    assert stored == [f"m{i}" for i in range(6)], "each stored once"
    assert len(model.requests) == 3, "the held turn, the failed merged turn, one resume"


def test_reject_raises_at_once_and_stores_nothing(held):
    graph = held.graph(features=[Sessions(busy_policy="reject")])
    held.begin(graph, "r")
    began = time.monotonic()
    with pytest.raises(SessionBusyError, match="'r' is running a turn"):
        graph.invoke({"messages": [HumanMessage("插队", id="b")]}, thread("r"))
    with pytest.raises(SessionBusyError):
        graph.invoke(None, thread("r"))  # a resume takes the lock too
    assert time.monotonic() - began < 0.5, "reject does not wait"
    held.end()
    graph.invoke({"messages": [HumanMessage("现在说", id="c")]}, thread("r"))
    assert [m.id for m in stored_humans(graph, "r")] == ["a", "c"]


@pytest.mark.parametrize("policy", ["merge", "enqueue"])
def test_a_waiting_caller_times_out_and_its_message_is_not_stored(policy, held):
    model, graph = held.model, held.graph(features=[Sessions(busy_policy=policy, busy_timeout=0.2)])
    held.begin(graph, "w")
    began = time.monotonic()
    with pytest.raises(SessionWaitTimeout, match=r"waited 0\.2 s") as caught:
        graph.invoke({"messages": [HumanMessage("等不及了", id="b")]}, thread("w"))
    assert isinstance(caught.value, TimeoutError)
    assert isinstance(caught.value, SessionBusyError)
    assert 0.15 < time.monotonic() - began < 2
    held.end()
    assert [m.id for m in stored_humans(graph, "w")] == ["a"]
    assert len(model.requests) == 1


def test_a_resume_waits_for_the_running_turn(held):
    model, graph = held.model, held.graph()
    held.begin(graph, "z")
    # Mid-turn the thread looks resumable; once the turn ends there is nothing to resume.
    with pytest.raises(NothingToResumeError):
        threading.Timer(0.2, held.release.set).start()
        graph.invoke(None, thread("z"))
    held.end()
    assert len(model.requests) == 1


# -- what a merged caller's stream yields --------------------------------------------------


def test_a_merged_callers_stream_yields_the_final_state_once(held):
    model, graph = held.model, held.graph()
    held.begin(graph, "s")
    chunks: dict[str, list] = {}

    def stream(mode, message_id: str) -> None:
        chunks[message_id] = list(
            graph.stream(
                {"messages": [HumanMessage("插话", id=message_id)]},
                thread("s"),
                stream_mode=mode,
            )
        )

    leader = threading.Thread(target=stream, args=("values", "b"))
    leader.start()
    until(lambda: queued(graph, "s") == 1)
    merged = [
        threading.Thread(target=stream, args=(mode, f"c-{i}"))
        for i, mode in enumerate(["values", "messages", ["updates", "values"]])
    ]
    for worker in merged:
        worker.start()
    until(lambda: queued(graph, "s") == 4)
    held.end()
    for worker in [leader, *merged]:
        worker.join()
    assert len(model.requests) == 2
    assert len(chunks["b"]) > 1, "the caller that runs the turn streams it"
    [final] = chunks["c-0"]
    assert answers(final, "c-0")
    assert final["messages"] == chunks["b"][-1]["messages"], (
        "the state the turn ended with, as saved"
    )
    assert chunks["c-1"] == [], "no tokens: the turn ran in another caller"
    assert chunks["c-2"] == [("values", final)]


async def test_async_merge_burst_and_reject():
    model = ScriptedChatModel(script=[echo] * 20, delay=0.2)
    async with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        first = asyncio.create_task(
            graph.ainvoke({"messages": [HumanMessage("先", id="a")]}, thread("ab"), context=GROUP)
        )
        await asyncio.sleep(0.05)
        burst = [
            asyncio.create_task(
                graph.ainvoke(
                    {"messages": [HumanMessage(f"插{i}", id=f"b{i}", name=f"人{i}")]},
                    thread("ab"),
                    context=GROUP,
                )
            )
            for i in range(5)
        ]
        states = await asyncio.gather(first, *burst)
        rejecting = build_graph(
            make_config(model, features=[Sessions(busy_policy="reject")]), saver
        )
        running = asyncio.create_task(
            rejecting.ainvoke({"messages": [HumanMessage("再来", id="c")]}, thread("ab"))
        )
        await asyncio.sleep(0.05)
        with pytest.raises(SessionBusyError):
            await rejecting.ainvoke({"messages": [HumanMessage("插队", id="d")]}, thread("ab"))
        await running
        stored = [
            m.id
            for m in (await graph.aget_state(thread("ab"))).values["messages"]
            if m.type == "human"
        ]
    assert len(model.requests) == 3, "first turn, the merged burst, the last turn"
    assert stored == ["a", *(f"b{i}" for i in range(5)), "c"]
    sent = ["a", *(f"b{i}" for i in range(5))]
    assert all(answers(s, i) for s, i in zip(states, sent, strict=True))


def test_merge_and_presence_answer_a_burst_with_one_mention_once(held):
    """A burst whose messages differ only in the platform's @-flag is one turn, answered
    once because one of its messages mentions the persona; each keeps its speaker."""
    model, graph = held.model, held.graph(features=[GroupPresence(reply="mentioned")])
    flagged = SessionEnv(actor="group", mentioned=True)

    def send(message: HumanMessage, env: SessionEnv = GROUP) -> None:
        graph.invoke({"messages": [message]}, thread("pm"), context=env)

    held.begin(graph, "pm", HumanMessage("昔涟，先说一句", id="m0", name="甲"), send=send)
    sent = [
        ("m1", "哈哈", "乙", GROUP),
        ("m2", "你觉得呢？", "丙", flagged),
        ("m3", "好的", "丁", GROUP),
    ]
    while_held(
        held,
        graph,
        "pm",
        [partial(send, HumanMessage(text, id=i, name=name), env) for i, text, name, env in sent],
    )
    assert len(model.requests) == 2, "the running turn, then one answer for the whole burst"
    assert ("human", "你觉得呢？") in model.requests[1].texts
    assert model.requests[1].messages[-1].content == "好的", "one turn took the whole burst"
    assert [(m.id, m.name) for m in stored_humans(graph, "pm")] == [
        ("m0", "甲"),
        ("m1", "乙"),
        ("m2", "丙"),
        ("m3", "丁"),
    ]
    send(HumanMessage("收到", id="m4", name="乙"))
    assert len(model.requests) == 2, "a message that mentions no one stays quiet"
