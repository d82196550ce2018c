"""One turn at a time per session: callers racing on one thread (the busy policies'
own tests are in `test_sessions_policies.py`, processes in `test_sessions_processes.py`).

Every test counts what was sent against what the saver stored: the two must be
equal, each message exactly once, and every caller gets back a state that
answers its own message.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from graph import Sessions, build_graph, open_checkpointer
from graph.sessions import queued
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel

SAVERS = ["memory", "sqlite", "postgres"]


def saver_url(kind: str, tmp_path, request) -> str:
    if kind == "postgres":
        return request.getfixturevalue("postgres_url")
    return "memory" if kind == "memory" else f"sqlite:///{tmp_path}/sessions.db"


def echo(messages) -> AIMessage:
    humans = [m for m in messages if m.type == "human"]
    return AIMessage(f"收到 {len(humans)} 句，最后一句：{humans[-1].content}")


def talk_model(replies: int = 400, delay: float = 0.0) -> ScriptedChatModel:
    return ScriptedChatModel(script=[echo] * replies, delay=delay)


def held_model(started: threading.Event, release: threading.Event) -> ScriptedChatModel:
    """The first reply waits for `release`, so a test can send messages mid-turn."""

    def held(messages) -> AIMessage:
        started.set()
        assert release.wait(10), "the test never released the first turn"
        return echo(messages)

    return ScriptedChatModel(script=[held] + [echo] * 40)


class HeldTurn:
    """A session's first turn, held inside its model call until `release`, so a test
    can send messages mid-turn (the model answers everything after it at once)."""

    def __init__(self, saver: Any = None) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.model = held_model(self.started, self.release)
        self.saver = saver
        self.first: threading.Thread | None = None

    def graph(self, **options: Any) -> Any:
        return build_graph(make_config(self.model, **options), self.saver)

    def begin(
        self,
        graph: Any,
        name: str,
        message: HumanMessage | None = None,
        send: Callable[[HumanMessage], object] | None = None,
    ) -> None:
        """Send `message` (default "慢慢说", id "a") on session `name` from a thread of its
        own (by `send`, if given); return once its turn is held in the model call."""
        message = message or HumanMessage("慢慢说", id="a")
        run = send or (lambda m: graph.invoke({"messages": [m]}, thread(name)))
        self.first = threading.Thread(target=run, args=(message,))
        self.first.start()
        assert self.started.wait(10)

    def end(self) -> None:
        """Let the held turn finish, and wait for it."""
        self.release.set()
        if self.first is not None:
            self.first.join()


def stored_humans(graph, name: str) -> list[HumanMessage]:
    return [m for m in graph.get_state(thread(name)).values["messages"] if m.type == "human"]


def answers(state: dict, message_id: str) -> bool:
    """The state holds the message, and a reply after it."""
    ids = [m.id for m in state["messages"]]
    return message_id in ids and any(
        m.type == "ai" for m in state["messages"][ids.index(message_id) :]
    )


def until(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


# -- the scenario: two callers, one session, at the same moment ----------------


def race(graph, name: str, rounds: int, callers: int = 2) -> tuple[list[str], list[bool]]:
    barrier = threading.Barrier(callers)
    sent: list[str] = []
    answered: list[bool] = []

    def caller(who: int) -> None:
        for r in range(rounds):
            message_id = f"{who}-{r}"
            barrier.wait()
            state = graph.invoke(
                {"messages": [HumanMessage(f"第{r}轮，我是{who}", id=message_id)]}, thread(name)
            )
            sent.append(message_id)
            answered.append(answers(state, message_id))

    workers = [threading.Thread(target=caller, args=(who,)) for who in range(callers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sent, answered


@pytest.mark.parametrize("policy", ["merge", "enqueue"])
@pytest.mark.parametrize("kind", SAVERS)
def test_two_callers_at_the_same_moment_lose_nothing(kind, policy, tmp_path, request):
    """60 messages sent at the same moment in pairs: 60 stored, each once, each answered."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    rounds = 30 if kind == "memory" else 15
    with open_checkpointer(saver_url(kind, tmp_path, request)) as saver:
        graph = build_graph(
            make_config(talk_model(delay=0.005), features=[Sessions(busy_policy=policy)]), saver
        )
        sent, answered = race(graph, name, rounds)
        stored = [m.id for m in stored_humans(graph, name)]
    assert len(sent) == 2 * rounds
    assert sorted(stored) == sorted(sent), f"sent {len(sent)}, stored {len(stored)}"
    assert all(answered), "every caller's state answers its own message"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_async_callers_at_the_same_moment_lose_nothing(kind, tmp_path, request):
    name, rounds = "arace", 15
    async with open_checkpointer(saver_url(kind, tmp_path, request)) as saver:
        graph = build_graph(make_config(talk_model(delay=0.005)), saver)
        states = []
        for r in range(rounds):
            states += await asyncio.gather(
                *(
                    graph.ainvoke(
                        {"messages": [HumanMessage(f"第{r}轮", id=f"{who}-{r}")]}, thread(name)
                    )
                    for who in range(2)
                )
            )
        state = await graph.aget_state(thread(name))
        stored = [m.id for m in state.values["messages"] if m.type == "human"]
    sent = [f"{who}-{r}" for r in range(rounds) for who in range(2)]
    assert sorted(stored) == sorted(sent)
    assert all(answers(s, i) for s, i in zip(states, sent, strict=True))


def test_a_saver_the_caller_made_is_locked_within_the_process(tmp_path):
    """No URL to reach the database by: the lock is in-process, and that still holds here."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(tmp_path / "own.db")) as saver:
        graph = build_graph(make_config(talk_model(delay=0.005)), saver)
        sent, answered = race(graph, "own", 10)
        assert sorted(m.id for m in stored_humans(graph, "own")) == sorted(sent)
    assert all(answered)


def test_messages_without_ids_get_one_and_are_stored_once():
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(talk_model(delay=0.005)), saver)
        barrier = threading.Barrier(3)

        def send(i: int) -> None:
            barrier.wait()
            graph.invoke({"messages": [("user", f"无编号 {i}")]}, thread("ids"))

        workers = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        humans = stored_humans(graph, "ids")
    assert sorted(m.content for m in humans) == [f"无编号 {i}" for i in range(3)]
    assert len({m.id for m in humans}) == 3


def test_a_graph_without_a_saver_of_its_own_is_not_locked():
    """Studio drives runs on a graph with no saver: its own multitask handling applies."""
    held = HeldTurn()
    graph = held.graph()
    held.begin(
        graph, "", HumanMessage("慢", id="a"), send=lambda m: graph.invoke({"messages": [m]})
    )
    out = graph.invoke({"messages": [HumanMessage("并行", id="b")]})  # does not wait
    held.end()
    assert answers(out, "b")


def test_two_graphs_on_one_saver_share_the_lock():
    saver = InMemorySaver()
    a = build_graph(make_config(talk_model(delay=0.005)), saver)
    b = build_graph(make_config(talk_model(delay=0.005)), saver)
    barrier = threading.Barrier(2)

    def send(graph, message_id: str) -> None:
        barrier.wait()
        graph.invoke({"messages": [HumanMessage("同时", id=message_id)]}, thread("two"))

    workers = [threading.Thread(target=send, args=(g, i)) for g, i in ((a, "x"), (b, "y"))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(m.id for m in stored_humans(a, "two")) == ["x", "y"]


async def test_a_cancelled_waiter_leaves_nothing_behind(tmp_path):
    model = ScriptedChatModel(script=[echo] * 5, delay=0.3)
    async with open_checkpointer(f"sqlite:///{tmp_path}/cancel.db") as saver:
        graph = build_graph(make_config(model), saver)
        first = asyncio.create_task(
            graph.ainvoke({"messages": [HumanMessage("慢慢说", id="a")]}, thread("c"))
        )
        await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                graph.ainvoke({"messages": [HumanMessage("算了", id="b")]}, thread("c")), 0.05
            )
        assert queued(graph, "c") == 0
        await first
        state = await graph.aget_state(thread("c"))
    assert [m.id for m in state.values["messages"] if m.type == "human"] == ["a"]
    assert len(model.requests) == 1


async def test_a_cancelled_caller_tells_by_its_message_id_whether_it_was_stored(tmp_path):
    """docs/durability.md "One turn at a time per session": a caller cancelled while waiting
    has its message stored (and answered) if a turn had taken it, else not at all; the
    transcript by id says which."""
    model = ScriptedChatModel(script=[echo] * 5, delay=0.3)
    async with open_checkpointer(f"sqlite:///{tmp_path}/cancel.db") as saver:
        graph = build_graph(make_config(model), saver)

        def send(text: str, message_id: str) -> asyncio.Task:
            turn = {"messages": [HumanMessage(text, id=message_id)]}
            return asyncio.create_task(graph.ainvoke(turn, thread("c")))

        def stored(values: dict, message_id: str) -> bool:
            return any(m.id == message_id for m in values["messages"])

        first = send("慢慢说", "a")
        await asyncio.sleep(0.1)
        second, third = send("第二句", "b"), send("第三句", "c")
        await asyncio.sleep(0.05)
        never = send("算了", "d")
        await asyncio.sleep(0.05)
        never.cancel()  # still waiting: nothing of it is stored
        await first  # the next turn takes b and c together (merge)
        await asyncio.sleep(0.1)
        third.cancel()  # taken by the running turn: stored and answered regardless
        await second
        values = (await graph.aget_state(thread("c"))).values
    assert [stored(values, i) for i in "abcd"] == [True, True, True, False]
    assert values["messages"][-1].type == "ai" and len(model.requests) == 2


def test_a_caller_that_stops_its_stream_early_gives_the_session_back():
    """Closing the stream mid-turn throws GeneratorExit into the run's steps; their
    `finally` still releases the session (else the next call waits out busy_timeout)."""
    graph = build_graph(
        make_config(talk_model(), features=[Sessions(busy_timeout=1)]), InMemorySaver()
    )
    chunks = graph.stream({"messages": [HumanMessage("一")]}, thread("early"), stream_mode="values")
    next(chunks)
    chunks.close()
    assert answers(graph.invoke({"messages": [HumanMessage("二", id="b")]}, thread("early")), "b")


async def test_an_async_caller_that_stops_its_stream_early_gives_the_session_back():
    graph = build_graph(
        make_config(talk_model(), features=[Sessions(busy_timeout=1)]), InMemorySaver()
    )
    turn = {"messages": [HumanMessage("一")]}
    chunks = graph.astream(turn, thread("early"), stream_mode="values")
    await anext(chunks)
    await chunks.aclose()
    out = await graph.ainvoke({"messages": [HumanMessage("二", id="b")]}, thread("early"))
    assert answers(out, "b")
