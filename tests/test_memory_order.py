"""A session's memory changes apply in the order they were said (issue 29, finding 3).

Background extraction runs off the reply path, so a session's next turn can come
before its previous extraction is stored. Each job is planned against a store that
holds what every earlier job of its session changed (`nodes.extraction.pipeline`): a forget
said right after a "remember" finds it, two quick corrections leave the last, and a
fact said twice in quick succession is stored once. Sessions still run side by side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import LLMExtractor, ManualExtractor, build_graph, open_checkpointer
from memory import MemoryItem, MemoryStore, Recalled, Scope
from memory.lifecycle.operations import Operation
from nodes.extraction.background import wait_for_extractions
from nodes.extraction.extractors import MemoryOperation, MemoryOperations
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel


class SlowBackgroundManual(ManualExtractor):
    """The manual forms, in the background, slow: the next turn comes before it is done."""

    background = True

    def __init__(self, delay: float) -> None:
        super().__init__(scope=Scope.USER)
        self.delay = delay

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> list[Operation]:
        time.sleep(self.delay)
        return super().extract_operations(messages, memories)


def say(store: MemoryStore, extractor, saver, session: str, *texts: str, gap: float) -> None:
    model = ScriptedChatModel(script=[AIMessage("好")] * len(texts))
    graph = build_graph(make_config(model, memory=store, extractor=extractor), saver)
    for n, text in enumerate(texts):
        graph.invoke({"messages": [HumanMessage(text, id=f"{session}-{n}")]}, thread(session))
        time.sleep(gap)


@pytest.fixture
def store(tmp_path):
    with MemoryStore.open(tmp_path / "memory") as opened:
        yield opened


@pytest.fixture
def saver(tmp_path):
    with open_checkpointer(f"sqlite:///{tmp_path}/c.db") as opened:
        yield opened


@pytest.mark.parametrize("trial", range(3))
def test_a_forget_right_after_a_remember_forgets_it_and_nothing_else(store, saver, trial):
    store.add_many(
        [
            MemoryItem(content="主人的猫叫团子", scope=Scope.USER),
            MemoryItem(content="主人住在杭州", scope=Scope.USER),
        ]
    )
    extractor = SlowBackgroundManual(delay=0.3)
    say(store, extractor, saver, "s", "记住 我的银行卡密码是 1234", "忘掉我的银行卡密码", gap=0.05)
    assert wait_for_extractions(20)
    assert sorted(m.content for m in store.list()) == ["主人住在杭州", "主人的猫叫团子"]


def test_two_quick_corrections_leave_the_last(store, saver):
    extractor = SlowBackgroundManual(delay=0.2)
    say(
        store,
        extractor,
        saver,
        "s",
        "记住 我每周一去健身房",
        "更正：我每周二去健身房",
        "更正：我每周四去健身房",
        gap=0.05,
    )
    assert wait_for_extractions(20)
    assert [m.content for m in store.list()] == ["我每周四去健身房"]


class SameFactTwice(ScriptedChatModel):
    """A structured-output model that adds the same fact in every turn, slowly."""

    def with_structured_output(self, schema, **kwargs):
        class Structured:
            def invoke(self, messages):
                time.sleep(0.2)
                fact = MemoryOperation(op="add", content="主人对花生过敏", scope="user")
                return MemoryOperations(operations=[fact])

        return Structured()


def test_a_fact_said_twice_in_quick_succession_is_stored_once(store, saver):
    extractor = LLMExtractor(SameFactTwice(), store=store)
    say(store, extractor, saver, "s", "我对花生过敏", "对了，我花生过敏", gap=0.1)
    assert wait_for_extractions(20)
    assert [m.content for m in store.list()] == ["主人对花生过敏"]


def test_sessions_still_run_side_by_side(store, saver):
    """Two sessions with slow extractors: their jobs overlap (one session never waits for
    another's), and each session's own changes keep their order."""
    extractor = SlowBackgroundManual(delay=0.5)
    started = time.monotonic()
    sessions = [
        threading.Thread(
            target=say,
            args=(store, extractor, saver, f"s{n}", f"记住 我第{n}个习惯是早睡"),
            kwargs={"gap": 0.0},
        )
        for n in range(4)
    ]
    for t in sessions:
        t.start()
    for t in sessions:
        t.join()
    assert wait_for_extractions(20)
    assert time.monotonic() - started < 1.9, "four 0.5 s extractions of four sessions overlap"
    assert len(store.list()) == 4
