"""A forgotten memory's turn leaves the model's view: the turn an extracted memory came
from (its opening, the reply that echoed it, its tool round) is in no later request, from
the live window or through conversation recall; by ids, never by the words. The
transcript keeps it; other turns and other sessions are shown as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import chromadb
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from graph import (
    Compaction,
    ConversationRecall,
    ManualExtractor,
    SessionEnv,
    build_graph,
    open_checkpointer,
    wait_for_extractions,
)
from graph.storage.archive import ProcessArchive
from memory import MemoryItem, MemoryStore
from memory.embedding import HashingEmbedding
from memory.items import Source
from memory.lifecycle import history
from memory.lifecycle.history import HISTORY_COLLECTION, ForgottenTurns, History
from nodes.kernel.messages import message_text
from nodes.kernel.transcript import without_turns
from nodes.recall.index import SESSION_INDEXES, SessionIndex
from tests.boundary_support import EndlessModel
from tests.conftest import make_config, thread
from tests.payload_checks import payload_problems
from tests.scripted import Request, call, tool_calls
from tests.test_conversation_recall import (
    BUDGET,
    GROUP,
    asked,
    imported,
    recalled_lines,
    with_fact,
)

SECRET = "4821"
FACT = f"记住 我的银行卡密码是{SECRET}"
NEIGHBOUR = "我妹妹三月去大理学陶艺了，她说那里的苍山很美。"


class EchoModel(EndlessModel):
    """Echoes what it is asked to remember, up to its first 。 ("好的，记住了：…"), asks for the time with a tool
    when the turn mentions 几点, and answers 好 otherwise; records every request."""

    def _next(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        with self._lock:
            self._requests.append(Request(list(messages), dict(kwargs)))
        last = [m for m in messages if not isinstance(m, SystemMessage)][-1]
        said = message_text(last)
        if isinstance(last, ToolMessage):
            return AIMessage(f"现在是{said}。")
        if "几点" in said:
            return tool_calls(call("get_time", f"t{len(self._requests)}"))
        if "记住" in said:
            return AIMessage("好的，记住了：" + said.split("记住", 1)[1].split("。")[0].strip())
        return AIMessage("好")


def graph_with(model, store, saver, budget: int = BUDGET):
    config = make_config(
        model,
        memory=store,
        extractor=ManualExtractor(),
        features=[Compaction(max_context_tokens=budget), ConversationRecall()],
    )
    return build_graph(config, saver)


def said(graph, text: str, name: str = "owner") -> None:
    graph.invoke({"messages": [HumanMessage(text)]}, thread(name))
    assert wait_for_extractions(30)


def extracted(store) -> str:
    """The id of the one memory holding `SECRET`, which an extraction made."""
    (memory,) = [m for m in store.list() if SECRET in m.content]
    assert memory.source.message_id, "an extracted memory names the message it came from"
    return str(memory.id)


def sent(model) -> str:
    return "\n".join(message_text(m) for m in model.requests[-1].messages)


@contextmanager
def forgotten_then_neighbour(tmp_path) -> Iterator[tuple[Any, EchoModel]]:
    """A graph whose owner said the fact, then `NEIGHBOUR` (archived), and forgot the fact."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver)
        said(graph, FACT)
        imported(graph, "owner", with_fact(NEIGHBOUR, at=0))
        assert store.forget(extracted(store))
        yield graph, model


def test_an_archived_forgotten_turn_does_not_come_back_through_recall(tmp_path):
    with forgotten_then_neighbour(tmp_path) as (graph, model):
        view = asked(graph, model, "owner", "我的银行卡密码是多少？记住了吗")
        assert SECRET not in view
        assert SESSION_INDEXES.settled(timeout=30)  # the next turn is indexed again, alone
        view = asked(graph, model, "owner", "我妹妹去大理学什么了？")
        assert any(NEIGHBOUR in line for line in recalled_lines(view)), "the next turn is recalled"
        messages = graph.get_state(thread("owner")).values["messages"]
    assert all(SECRET not in message_text(m) for m in messages), "archived, not in the window"


def test_the_message_after_a_forgotten_turn_does_not_recognise_its_words(tmp_path):
    """Recall indexes a message with the one before it; the next turn's first message was
    indexed with the forgotten reply, and surfaced for the forgotten code, or for any three of
    its characters: a way to test guesses."""
    with forgotten_then_neighbour(tmp_path) as (graph, model):
        # The round right after the forget, then one after the index was rebuilt without it.
        for guess in (SECRET, SECRET[1:]):
            view = asked(graph, model, "owner", guess)
            assert not any(NEIGHBOUR in line for line in recalled_lines(view)), guess
            assert SESSION_INDEXES.settled(timeout=30)
        view = asked(graph, model, "owner", "我妹妹去大理学什么了？")
        assert any(NEIGHBOUR in line for line in recalled_lines(view)), "found by its own words"


def test_until_the_index_leaves_the_turn_out_a_search_drops_what_may_hold_its_words():
    """The pass that leaves a forgotten turn out runs in the background; a round before it
    ends searches entries that hold its words, and shows none of them."""
    archive, where = ProcessArchive(), ("owner", "")
    forgotten = HumanMessage("记住 门禁密码是ZEBRA7391", id="forgotten")
    reply, after = AIMessage("好的，记住了：ZEBRA7391"), HumanMessage("谢谢，帮我收好", id="next")
    archive.append(where, 0, [forgotten, reply, after, AIMessage("好")])
    index = SessionIndex()
    index.catch_up(archive, where, 4)
    turns = frozenset({"forgotten"})

    def found(query: str) -> list[str]:
        hits = index.search(query, restricted=False, n=10, forgotten=turns)
        return [message_text(hit.message) for hit in hits]

    assert found("ZEBRA7391") == found("739") == [], "before the pass"
    index.catch_up(archive, where, 4, turns)
    assert found("ZEBRA7391") == found("739") == [], "after it"
    assert after.content in found("帮我收好"), "the next message, indexed alone"


def test_an_index_built_after_the_forget_holds_none_of_the_turn_s_words(tmp_path):
    """A new process builds the session's index from the archive: without the forgotten turn,
    and with the message after it indexed alone."""
    url = f"sqlite:///{tmp_path / 'checkpoints.db'}"
    with MemoryStore.open(tmp_path / "memory") as store:
        with open_checkpointer(url) as saver:
            graph = graph_with(EchoModel(), store, saver)
            said(graph, FACT)
            imported(graph, "owner", with_fact(NEIGHBOUR, at=0))
        assert store.forget(extracted(store))
        model = EchoModel()
        with open_checkpointer(url) as saver:  # a new process's archive: its index is new
            graph = graph_with(model, store, saver)
            view = asked(graph, model, "owner", SECRET[:3])
            assert not any(NEIGHBOUR in line for line in recalled_lines(view))
            view = asked(graph, model, "owner", "我妹妹去大理学什么了？")
            assert any(NEIGHBOUR in line for line in recalled_lines(view))


def test_a_forgotten_turn_in_the_live_window_is_not_sent_again(tmp_path):
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        said(graph, FACT)
        said(graph, NEIGHBOUR)
        said(graph, "忘掉 我的银行卡密码")
        assert not [m for m in store.list() if SECRET in m.content], "the chat forgot it"
        said(graph, "我的银行卡密码是多少？")
        transcript = graph.get_state(thread("owner")).values["messages"]
    assert SECRET not in sent(model)
    assert NEIGHBOUR in sent(model)
    assert sum(SECRET in message_text(m) for m in transcript) == 2, "the transcript keeps it"


def test_a_summary_written_after_the_forget_leaves_the_turn_out(tmp_path):
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver)
        for n in range(22):
            said(graph, f"第{n}句闲聊，今天天气很好，吃了面条。")
            if n == 9:
                said(graph, FACT)
                assert store.forget(extracted(store))
        summary = graph.get_state(thread("owner")).values["summary"]["text"]
    assert "第9句闲聊" in summary and "第10句闲聊" in summary
    assert SECRET not in summary


def test_a_window_that_starts_inside_a_forgotten_turn_leaves_its_rest_out(tmp_path):
    """Compaction may cut inside a turn: the opening is archived, the echo still in the
    window; the archive names the turn the window starts in, and the echo stays out."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver)
        said(graph, f"{FACT}。" + "这件事很重要" * 180)
        for n in range(6):
            said(graph, f"第{n}句闲聊，今天天气很好")
        window = graph.get_state(thread("owner")).values["messages"]
        assert isinstance(window[0], AIMessage) and SECRET in message_text(window[0])
        assert store.forget(extracted(store))
        said(graph, "我的银行卡密码是多少？")
    # The summary written before the forget is rewritten without it (test_forgotten_summary.py).
    assert "好的，记住了" not in sent(model)
    assert "第5句闲聊" in sent(model)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_forgotten_turn_with_a_tool_round_leaves_a_valid_request(tmp_path, provider):
    model = EchoModel(provider=provider)
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        said(graph, f"{FACT}，顺便看看现在几点")
        said(graph, "现在几点了？")
        assert store.forget(extracted(store))
        said(graph, "我的银行卡密码是多少？")
    view = model.requests[-1].messages
    assert SECRET not in sent(model)
    assert sum(isinstance(m, ToolMessage) for m in view) == 1, "the neighbour's tool round stays"
    assert payload_problems(provider, view) == []


def test_a_group_session_is_unaffected_by_an_owner_s_forget(tmp_path):
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        graph.invoke(
            {"messages": [HumanMessage("大家周末去爬山吧", name="小明")]},
            thread("group"),
            context=GROUP,
        )
        said(graph, FACT)
        assert store.forget(extracted(store))
        group = asked(graph, model, "group", "周末去哪里？", GROUP)
        owner = asked(graph, model, "owner", "我的银行卡密码是多少？")
    assert "大家周末去爬山吧" in group
    assert SECRET not in owner


def test_a_forget_leaves_another_session_s_turn_of_the_same_message_id_in_view(tmp_path):
    """Callers may number messages per chat (the README's quickstart says id="m1"): a forget
    hides the turn of the session the memory was said in, not every turn with that id."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        graph.invoke({"messages": [HumanMessage(FACT, id="m1")]}, thread("a"))
        graph.invoke({"messages": [HumanMessage(NEIGHBOUR, id="m1")]}, thread("b"))
        assert wait_for_extractions(30)
        assert store.forget(extracted(store))
        other = asked(graph, model, "b", "我妹妹去哪了？")
        mine = asked(graph, model, "a", "我的银行卡密码是多少？")
    assert NEIGHBOUR in other
    assert SECRET not in mine


@pytest.mark.parametrize(
    "contexts",
    [
        pytest.param((SessionEnv(turn_id="turn-7"), SessionEnv()), id="the app's turn id"),
        pytest.param((SessionEnv(session_id="chat-A"), SessionEnv()), id="session id, then none"),
        pytest.param(
            (SessionEnv(session_id="chat-A"), SessionEnv(session_id="chat-B")),
            id="session id, then another",
        ),
    ],
)
def test_the_turn_leaves_its_thread_s_view_whatever_ids_the_app_stamped(tmp_path, contexts):
    """`SessionEnv.session_id` and `turn_id` name a memory's provenance as the app wants it;
    the turn a forget takes out is where it ran: its thread and its opening message."""
    said_with, later = contexts
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        graph.invoke({"messages": [HumanMessage(FACT)]}, thread("owner"), context=said_with)
        graph.invoke({"messages": [HumanMessage(NEIGHBOUR)]}, thread("owner"), context=later)
        assert wait_for_extractions(30)
        (memory,) = [m for m in store.list() if SECRET in m.content]
        provenance = (said_with.session_id or "owner", said_with.turn_id or opened_by(memory))
        assert (memory.source.session_id, memory.source.message_id) == provenance
        assert store.forget(str(memory.id))
        graph.invoke({"messages": [HumanMessage("我妹妹去哪了？")]}, thread("owner"), context=later)
    assert SECRET not in sent(model)
    assert NEIGHBOUR in sent(model)


@pytest.mark.parametrize("corrected", [False, True], ids=["said again", "said again, corrected"])
def test_a_fact_forgotten_said_again_and_forgotten_again_leaves_both_turns_out(tmp_path, corrected):
    """The same words make the same memory id, so the second forget's tombstone (or the
    correction's record of what it replaced) is written where the first tombstone was."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        said(graph, FACT)
        said(graph, "忘掉 我的银行卡密码")
        said(graph, FACT)
        if corrected:
            said(graph, "更正：我的银行卡密码改成了0000")
        said(graph, "忘掉 我的银行卡密码")
        assert store.list() == [], "the chat forgot it twice"
        said(graph, "我的银行卡密码是多少？")
    assert SECRET not in sent(model)


def opened_by(memory: MemoryItem) -> str | None:
    return memory.source.opening_id


def broken(session_id: str | None, thread_id: str | None = None) -> frozenset[str]:
    raise RuntimeError("the store is down")


def test_a_store_that_never_named_forgotten_turns_fails_no_turn(tmp_path, monkeypatch):
    """With no answer ever, the live window is shown whole, and recall is left out for the
    round (fail open for what the model answers, closed for the extra)."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        imported(graph_with(model, store, saver), "owner", with_fact(NEIGHBOUR, at=0))
        monkeypatch.setattr(store, "forgotten_turns", broken)
        graph = graph_with(model, store, saver)  # a new loop: it has asked nothing yet
        view = asked(graph, model, "owner", "我妹妹去大理学什么了？")
        reply = graph.get_state(thread("owner")).values["messages"][-1]
    assert recalled_lines(view) == []
    assert "我妹妹去大理学什么了？" in view
    assert isinstance(reply, AIMessage) and message_text(reply) == "好"


def test_a_store_that_stops_answering_keeps_what_was_forgotten_out(tmp_path, monkeypatch):
    """Once it answered, a store that fails (a server restarting) is taken at its last
    answer: the forgotten turn does not come back for want of a read."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, budget=100_000)
        said(graph, FACT)
        said(graph, NEIGHBOUR)
        assert store.forget(extracted(store))
        assert SECRET not in asked(graph, model, "owner", "还在吗？")
        monkeypatch.setattr(store, "forgotten_turns", broken)
        view = asked(graph, model, "owner", "我的银行卡密码是多少？")
        reply = graph.get_state(thread("owner")).values["messages"][-1]
    assert SECRET not in view and NEIGHBOUR in view
    assert isinstance(reply, AIMessage) and message_text(reply) == "好"


def test_the_tombstone_names_the_turns_of_the_memory_and_what_it_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "CHECK_INTERVAL", 0.0)  # the worker looks at every ask
    client = chromadb.PersistentClient(path=str(tmp_path / "memory"))
    store, worker = (MemoryStore(client, embedding_function=HashingEmbedding()) for _ in "ab")
    first = MemoryItem(
        content=f"我的银行卡密码是{SECRET}", source=Source(session_id="s", message_id="m1")
    )
    old = store.add(first)
    assert worker.forgotten_turns("s") == frozenset()
    again = MemoryItem(
        content="我的银行卡密码是9902", source=Source(session_id="s", message_id="m2")
    )
    store.supersede(old, again)
    (new,) = [m.id for m in store.list()]
    assert worker.forgotten_turns("s") == frozenset(), "a supersede forgets nothing"
    assert store.forget(str(new))
    assert store.forgotten_turns("s") == {"m1", "m2"}
    assert worker.forgotten_turns("s") == {"m1", "m2"}, "another worker sees it by the count"
    assert worker.forgotten_turns("another session") == frozenset()
    tombstones = client.get_collection(HISTORY_COLLECTION).get(include=["documents", "metadatas"])
    assert tombstones["documents"] == [None, None]
    keys = {k for meta in tombstones["metadatas"] for k in meta}
    assert keys <= {"state", "at", "scope", "persona_id", "source_message_id", "source_session_id"}


def test_another_worker_s_forget_is_seen_within_the_check_interval(tmp_path):
    """A round asks several times; the history's count is looked at once a `CHECK_INTERVAL`,
    and this process's own forget is seen at once."""
    client = chromadb.PersistentClient(path=str(tmp_path / "memory"))
    store, worker = (MemoryStore(client, embedding_function=HashingEmbedding()) for _ in "ab")
    now = [0.0]
    turns = ForgottenTurns(History(client, worker._documents), clock=lambda: now[0])
    kept = store.add(MemoryItem(content="我妹妹叫王小丫", source=Source(message_id="m0")))
    gone = store.add(
        MemoryItem(content=f"我的银行卡密码是{SECRET}", source=Source(message_id="m1"))
    )
    store.forget(kept)  # the history now exists, and the check has something to count
    assert turns.read(None) == {"m0"}
    assert store.forget(gone)
    assert store.forgotten_turns(None) == {"m0", "m1"}, "its own forget, at once"
    now[0] += history.CHECK_INTERVAL / 2
    assert turns.read(None) == {"m0"}, "no count between checks"
    now[0] += history.CHECK_INTERVAL / 2
    assert turns.read(None) == {"m0", "m1"}


def test_without_turns_drops_whole_turns_and_keeps_the_one_being_answered():
    window = [
        AIMessage("上一轮的回复"),
        HumanMessage("a", id="a"),
        AIMessage("", tool_calls=[{"name": "get_time", "args": {}, "id": "c1"}]),
        ToolMessage("08:30", tool_call_id="c1"),
        AIMessage("回复a"),
        HumanMessage("b", id="b"),
        AIMessage("回复b"),
        HumanMessage("c", id="c"),
    ]
    kept = without_turns(window, {"a", "c", "x"}, opener="x")
    assert [message_text(m) for m in kept] == ["b", "回复b", "c"]
    folded = without_turns(window[:7], {"b"}, answering=False)
    assert [message_text(m) for m in folded][-1] == "回复a"
