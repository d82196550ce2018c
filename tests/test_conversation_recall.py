"""Conversation recall (issue 31): what compaction archived comes back to the model when it
is relevant, dated and attributed, within its budget, and only in the session it was said in.

Every session here imports a long history (`Trusted`, dated) under a small compaction
budget, so most of it moves to the transcript archive; the next turn asks about something
said early on, and the scripted model records what it is sent.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph import (
    Compaction,
    ConversationRecall,
    SessionEnv,
    Trusted,
    build_graph,
    open_checkpointer,
)
from graph.storage.archive import ProcessArchive
from nodes.kernel.messages import message_text
from nodes.kernel.transcript import RESTRICTED, annotated, dated, said_at
from nodes.recall.block import RECALL_HEADER, estimated_tokens
from nodes.recall.index import FIRST_ROUND_WAIT, SESSION_INDEXES, SessionIndex, SessionIndexes
from tests.boundary_support import endless
from tests.conftest import FIXED_NOW, make_config, thread

BUDGET = 400
"""Compaction's budget: a 60-exchange history is mostly archived."""
START = datetime(2025, 3, 1, 20, 0, tzinfo=UTC)
GROUP, STRANGER = SessionEnv(actor="group"), SessionEnv(actor="stranger")


def filler(n: int, name: str | None = None) -> list:
    """`n` dated exchanges of small talk, a day apart, from `START` on."""
    messages: list = []
    for i in range(n):
        when = START + timedelta(days=i)
        messages += [
            dated(HumanMessage(f"今天第{i}天，天气还行，吃了面条。", name=name), when),
            dated(AIMessage(f"听起来不错，第{i}天也要好好休息。", name="xilian"), when),
        ]
    return messages


def with_fact(fact: str, at: int, n: int = 60, name: str | None = None) -> list:
    """A history of `n` exchanges whose exchange `at` opens with `fact`."""
    messages = filler(n, name)
    messages[2 * at] = dated(HumanMessage(fact, name=name), START + timedelta(days=at))
    return messages


def graph_of(model, saver, *features):
    features = features or (ConversationRecall(),)
    config = make_config(model, features=[Compaction(max_context_tokens=BUDGET), *features])
    return build_graph(config, saver)


def imported(graph, name: str, history: list, env: SessionEnv | None = None) -> None:
    """Import `history` into session `name`, archive most of it, and let the index catch up."""
    opening = HumanMessage("导入完毕", name=history[0].name)
    graph.invoke(Trusted({"messages": [*history, opening]}), thread(name), context=env)
    state = graph.get_state(thread(name)).values
    assert state["archived"]["messages"] > len(history) // 2, "most of the history is archived"
    graph.invoke({"messages": [HumanMessage("嗯", name=opening.name)]}, thread(name), context=env)
    assert SESSION_INDEXES.settled(timeout=30)


def asked(graph, model, name: str, question: str, env: SessionEnv | None = None) -> str:
    """The text of everything the model was sent for `question` in session `name`."""
    human = HumanMessage(question, name="小明" if env is not None else None)
    graph.invoke({"messages": [human]}, thread(name), context=env)
    return "\n".join(message_text(m) for m in model.requests[-1].messages)


def recalled_lines(view: str) -> list[str]:
    """The recall block's messages in a view's text, each as `date speaker：text` ([] when
    there is no block)."""
    if RECALL_HEADER not in view:
        return []
    lines, day = [], None
    for line in view.split(RECALL_HEADER, 1)[1].split("\n")[1:]:
        if line.startswith("[") and line.endswith("]"):
            day = line[1:-1]
        elif line.startswith("- "):
            lines.append(f"{day} {line[2:]}")
        else:
            break
    return lines


def test_an_archived_message_comes_back_with_its_date_and_speaker():
    model = endless()
    fact = "我妹妹三月去大理学陶艺了，她说那里的苍山很美。"
    with open_checkpointer("memory") as saver:
        graph = graph_of(model, saver)
        imported(graph, "owner", with_fact(fact, at=3))
        window = graph.get_state(thread("owner")).values["messages"]
        assert all(fact not in message_text(m) for m in window), "the fact is archived"
        view = asked(graph, model, "owner", "我妹妹去大理学什么了？")
    assert "2025-03-04 主人：" + fact in recalled_lines(view)


def test_a_reply_is_dated_by_its_turn_and_named_by_who_said_it():
    """An undated reply is said in its turn; the answering persona's own words are `你`,
    another persona's carry its name."""
    model = endless()
    history = filler(60)
    history[9] = AIMessage("苍山的陶艺课每周三上课，记得带围裙。", name="xilian")  # undated
    history[11] = dated(AIMessage("陶艺课的老师姓林。", name="aglaea"), START)
    with open_checkpointer("memory") as saver:
        graph = graph_of(model, saver)
        imported(graph, "reply", history)
        lines = recalled_lines(asked(graph, model, "reply", "陶艺课哪天上课？老师是谁？"))
    assert "2025-03-05 你：苍山的陶艺课每周三上课，记得带围裙。" in lines
    assert "2025-03-01 「阿格莱雅」（aglaea）：陶艺课的老师姓林。" in lines


def test_the_block_stays_within_its_budget():
    model = endless()
    history = filler(60)
    for i in range(0, 80, 2):  # forty archived messages all about the same thing
        history[i] = dated(HumanMessage(f"陶艺课第{i}次：拉坯、修坯、上釉，陶艺真有意思。"), START)
    with open_checkpointer("memory") as saver:
        graph = graph_of(model, saver, ConversationRecall(max_tokens=120))
        imported(graph, "budget", history)
        view = asked(graph, model, "budget", "陶艺课都学了什么？")
    [memory] = [m for m in model.requests[-1].messages if RECALL_HEADER in message_text(m)]
    assert message_text(memory).startswith(RECALL_HEADER), "no memory store: recall alone"
    assert 1 <= len(recalled_lines(view)) < 40
    assert estimated_tokens(message_text(memory)) <= 120


def test_off_when_the_feature_is_off():
    model = endless()
    fact = "我妹妹三月去大理学陶艺了。"
    with open_checkpointer("memory") as saver:
        graph = graph_of(model, saver, ConversationRecall(max_tokens=0))
        imported(graph, "off", with_fact(fact, at=3))
        view = asked(graph, model, "off", "我妹妹去大理学什么了？")
    assert RECALL_HEADER not in view and fact not in view


OWNER_CANARY = "CANARY-OWNER 主人的私密日记：银行卡密码藏在陶罐里"
OTHER_OWNER_CANARY = "CANARY-OTHER 另一个主人会话：陶罐里是护照"
GROUP_CANARY = "CANARY-GROUP 群里说好了：陶罐聚会周六见"
PROBE = "陶罐里藏着什么？密码 护照 聚会 CANARY"


def test_conversation_recall_keeps_sessions_apart():
    """Owner, another owner session, a group and a stranger share one saver: each recalls
    only its own archive, and nothing an owner said reaches a group or a stranger."""
    model = endless()
    with open_checkpointer("memory") as saver:
        graph = graph_of(model, saver)
        imported(graph, "owner-a", with_fact(OWNER_CANARY, at=2))
        imported(graph, "owner-b", with_fact(OTHER_OWNER_CANARY, at=2))
        imported(graph, "group", with_fact(GROUP_CANARY, at=2, name="小红"), GROUP)
        imported(graph, "stranger", filler(60, name="路人"), STRANGER)
        views = {
            "owner-a": asked(graph, model, "owner-a", PROBE),
            "owner-b": asked(graph, model, "owner-b", PROBE),
            "group": asked(graph, model, "group", PROBE, GROUP),
            "stranger": asked(graph, model, "stranger", PROBE, STRANGER),
        }
    own = {"owner-a": OWNER_CANARY, "owner-b": OTHER_OWNER_CANARY, "group": GROUP_CANARY}
    for session, view in views.items():
        canaries = {c.split()[0] for c in own.values() if c.split()[0] in view}
        expected = {own[session].split()[0]} if session in own else set()
        assert canaries == expected, (session, canaries)
    assert "群聊隔离：" + RECALL_HEADER in views["group"]
    assert "2025-03-03 「小红」：" + GROUP_CANARY in recalled_lines(views["group"])


def test_a_restricted_view_never_reads_what_an_owner_said_in_the_same_thread():
    """Even a thread holding both (one no session binding guards): the owner's words, and
    the replies of the turns they opened, are in a bucket no restricted search reads."""
    archive, where = ProcessArchive(), ("mixed", "")
    owner_turn = [HumanMessage(OWNER_CANARY), AIMessage("CANARY-REPLY 陶罐里的密码我记住了")]
    group_turn = [
        annotated(HumanMessage(GROUP_CANARY, name="小红"), **{RESTRICTED: True}),
        AIMessage("陶罐聚会我也去"),
    ]
    archive.append(where, 0, [*owner_turn, *group_turn, *owner_turn])
    index = SessionIndex()
    index.catch_up(archive, where, 6)
    restricted = [message_text(r.message) for r in index.search(PROBE, restricted=True, n=10)]
    owner = [message_text(r.message) for r in index.search(PROBE, restricted=False, n=10)]
    assert restricted and not any("CANARY-OWNER" in t or "CANARY-REPLY" in t for t in restricted)
    assert any("CANARY-OWNER" in t for t in owner)


def test_the_boundary_dates_what_it_admits():
    """A human message is dated by the loop's clock; a trusted import keeps its own date; a
    participant cannot bring one, and a trusted date that is not a date is refused."""
    model = endless()
    claimed = dated(HumanMessage("我说这是去年说的"), START)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        graph.invoke({"messages": [claimed]}, thread("dates"))
        graph.invoke(Trusted({"messages": [claimed]}), thread("dates"))
        stored = [m for m in graph.get_state(thread("dates")).values["messages"]]
        with pytest.raises(ValueError, match="said_at"):
            bad = annotated(HumanMessage("x"), said_at="去年")
            graph.invoke(Trusted({"messages": [bad]}), thread("dates"))
    humans = [m for m in stored if isinstance(m, HumanMessage)]
    assert [said_at(m) for m in humans] == [FIXED_NOW, START]


class SlowArchive(ProcessArchive):
    """An archive whose reads wait until the test lets them go."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def read(self, thread, start, stop):
        assert self.go.wait(timeout=30)
        return super().read(thread, start, stop)


def test_indexing_runs_off_the_turn():
    """A round whose session index is behind its archive does not wait for it: the catch-up
    runs in the background, and the round searches what is indexed."""
    archive, where = SlowArchive(), ("slow", "")
    indexes = SessionIndexes()
    indexes.of(archive, where, 0)  # the session's first round, when nothing was archived yet
    archive.append(where, 0, with_fact(OWNER_CANARY, at=2))
    started = time.perf_counter()
    index = indexes.of(archive, where, 120)
    assert index.search(PROBE, restricted=False, n=5) == []
    assert time.perf_counter() - started < 1.0, "the round did not wait for the archive"
    archive.go.set()
    assert indexes.settled(timeout=30)
    found = index.search(PROBE, restricted=False, n=5)
    assert OWNER_CANARY in [message_text(r.message) for r in found]


def test_a_session_new_to_the_process_recalls_in_its_first_round(tmp_path):
    """A process that runs one turn and exits (`cyrene run`) recalls too: the session's
    first round in a process waits for its index, for at most `FIRST_ROUND_WAIT`."""
    url = f"sqlite:///{tmp_path / 'checkpoints.db'}"
    fact = "我妹妹三月去大理学陶艺了，她说那里的苍山很美。"
    with open_checkpointer(url) as saver:
        imported(graph_of(endless(), saver), "owner", with_fact(fact, at=3))
    model = endless()
    with open_checkpointer(url) as saver:  # a new process's archive: its index is new
        view = asked(graph_of(model, saver), model, "owner", "我妹妹去大理学什么了？")
    assert "2025-03-04 主人：" + fact in recalled_lines(view)


def test_a_first_round_waits_for_a_slow_archive_no_longer_than_its_bound():
    archive, where = SlowArchive(), ("slow", "")
    archive.append(where, 0, with_fact(OWNER_CANARY, at=2))
    started = time.perf_counter()
    index = SessionIndexes().of(archive, where, 120)
    waited = time.perf_counter() - started
    assert index.search(PROBE, restricted=False, n=5) == []
    archive.go.set()
    assert FIRST_ROUND_WAIT <= waited < FIRST_ROUND_WAIT + 1.0


@pytest.mark.xfail(
    strict=True,
    reason="a memory added by hand names no message it came from, so no turn is left out; its "
    "words are not matched either: any recogniser of a short forgotten text kept after the "
    "forget (a hash, a fingerprint) is a way to recover it (docs/memory.md)",
)
def test_a_forgotten_memory_s_words_do_not_come_back_through_recall(tmp_path):
    from memory import MemoryItem, MemoryStore

    model = endless()
    said = "记住 我的银行卡密码是PINxq8842"
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        memory_id = store.add(MemoryItem(content="我的银行卡密码是PINxq8842"))
        config = make_config(
            model,
            memory=store,
            features=[Compaction(max_context_tokens=BUDGET), ConversationRecall()],
        )
        graph = build_graph(config, saver)
        imported(graph, "owner", with_fact(said, at=3))
        store.forget(memory_id)
        view = asked(graph, model, "owner", "我的银行卡密码是多少？")
    assert "PINxq8842" not in view
