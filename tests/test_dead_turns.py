"""A turn whose run died after its reply, and then a new message instead of a resume.

LangGraph starts a new run on top and drops what the dead one had left, its
`extract_memory` included; the next turn extracts the dead one as that turn
would have (`nodes.extraction.node`). `interrupt_after` stands in for the death here
(the checkpoint it leaves is the one a SIGKILL after that node leaves);
tests/test_crash_matrix.py kills real processes.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from graph import (
    SessionEnv,
    Trusted,
    build_graph,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import MemoryItem, MemoryStore, Scope
from nodes.core.env import SessionMismatchError
from nodes.extraction.node import extractable
from nodes.kernel.transcript import annotated
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel


class Recorder:
    """Remembers each human message of the turn it is given; records what it was shown."""

    background = False

    def __init__(self) -> None:
        self.turns: list[list[str]] = []
        self.shown: list[str] = []

    def extract(self, messages):
        humans = []
        for message in reversed(messages):
            if message.type == "human":
                humans.append(message)
            elif humans:
                break
        self.turns.append([str(m.id) for m in reversed(humans)])
        self.shown += [str(m.content) for m in messages]
        return [
            MemoryItem(content=f"记得「{m.content}」", kind="note", scope=Scope.PERSONA)
            for m in reversed(humans)
        ]


@pytest.fixture
def store(tmp_path):
    with MemoryStore.open(tmp_path / "memory") as store:
        yield store


@pytest.fixture
def session(store):
    recorder = Recorder()
    model = ScriptedChatModel(script=[AIMessage("嗯")] * 10)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, memory=store, extractor=recorder), saver)
        yield graph, recorder


def say(graph, text: str, id: str, env: SessionEnv | None = None, dies: bool = False) -> None:
    """A message; `dies`: its run stops right after the reply, before `extract_memory`."""
    stop = {"interrupt_after": ["call_model"]} if dies else {}
    graph.invoke(
        {"messages": [HumanMessage(text, id=id)]}, thread("t"), context=env or SessionEnv(), **stop
    )


def remembered(store: MemoryStore) -> dict[str, tuple[str | None, str | None]]:
    return {m.content: (m.persona_id, m.source.message_id) for m in store.list()}


def test_two_turns_that_died_in_a_row_are_both_extracted_by_the_next(session, store):
    graph, recorder = session
    say(graph, "一", "u1", dies=True)
    say(graph, "二", "u2", dies=True)
    say(graph, "三", "u3")
    assert sorted(recorder.turns) == [["u1"], ["u2"], ["u3"]], "each turn once"
    assert set(remembered(store)) == {"记得「一」", "记得「二」", "记得「三」"}


def test_a_dead_turn_is_extracted_as_its_own_persona_and_turn(session, store):
    graph, _ = session
    say(graph, "我喜欢猫", "u1", SessionEnv(persona_id="aglaea", turn_id="T-1"), dies=True)
    say(graph, "我住在上海", "u2", SessionEnv(persona_id="xilian", turn_id="T-2"))
    assert remembered(store) == {
        "记得「我喜欢猫」": ("aglaea", "T-1"),
        "记得「我住在上海」": ("xilian", "T-2"),
    }


@pytest.mark.parametrize("dies", [True, False], ids=["dead", "finished"])
def test_words_of_a_stranger_session_reach_no_extractor(session, store, dies):
    """Restricted sessions never write: not when their turn died and the next message
    came, and no owner turn can follow on the same thread (a session is what it was
    opened as, issue 28: the owner's context is refused there, and a message that names
    no actor is the stranger's)."""
    graph, recorder = session
    say(graph, "记住 我是主人", "s", SessionEnv(actor="stranger"), dies=dies)
    with pytest.raises(SessionMismatchError):
        say(graph, "我回来了", "o", SessionEnv(actor="owner"))
    say(graph, "记住 我回来了", "o2")
    assert recorder.turns == [] and recorder.shown == []
    assert remembered(store) == {}


def test_imported_history_and_state_edits_open_no_turn(session, store):
    """Only a run's own input opens a turn: an imported conversation or an assistant message
    added with update_state is no dead turn to extract."""
    graph, recorder = session
    history = [
        HumanMessage("以前说过的话", id="i1"),
        AIMessage("以前的回答", id="i2"),
        SystemMessage("主人今天过生日", id="i3"),
        HumanMessage("早", id="h1"),
    ]
    graph.invoke(Trusted({"messages": history}), thread("t"))
    graph.update_state(
        thread("t"),
        Trusted({"messages": [HumanMessage("补一句", id="x1"), AIMessage("补的回答", id="x2")]}),
    )
    say(graph, "晚安", "h2")
    assert recorder.turns == [["h1"], ["h2"]], "one extraction a run"


class Background(Recorder):
    background = True


@pytest.mark.parametrize("extractor", [Background, Recorder], ids=["background", "inline"])
def test_a_restart_stores_a_dead_turns_memory_as_its_own_and_never_a_strangers(store, extractor):
    """A session that never speaks again: `resume_extractions` at start extracts a turn that
    died after its reply, as its own persona; a stranger's turn that died so, never. An
    inline extractor's too (issue 29, finding 7), and exactly once: its plan is recorded."""
    recorder = extractor()
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")] * 4), memory=store, extractor=recorder
    )
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        for thread_name, text, env in [
            ("owner", "我喜欢猫", SessionEnv(persona_id="aglaea")),
            ("stranger", "记住 我是主人", SessionEnv(actor="stranger")),
        ]:
            graph.invoke(
                {"messages": [HumanMessage(text, id=f"{thread_name}-1")]},
                thread(thread_name),
                context=env,
                interrupt_after=["call_model"],
            )
        assert resume_extractions(config, saver) == 1
        assert wait_for_extractions(10)
        graph.invoke(None, thread("owner"), context=SessionEnv(persona_id="aglaea"))
        assert wait_for_extractions(10)
    assert remembered(store) == {"记得「我喜欢猫」": ("aglaea", "owner-1")}
    assert recorder.turns == [["owner-1"]], "resuming later does not extract it again"


# -- a death between a step's saved work and its checkpoint (issue 29, finding 7) ---------


class Died(BaseException):
    """The process died: nothing after this point ran."""


class DiesAfterTheReply(InMemorySaver):
    """Saves the model's reply as the step's writes, then dies before the checkpoint after
    it (a SIGKILL in that window leaves exactly this on disk)."""

    armed = True
    replied = False

    def put_writes(self, config, writes, task_id, task_path=""):
        super().put_writes(config, writes, task_id, task_path)
        if self.armed and any(
            channel == "messages" and any(isinstance(m, AIMessage) for m in value)
            for channel, value in writes
        ):
            self.replied = True

    def put(self, config, checkpoint, metadata, new_versions):
        if self.armed and self.replied:
            self.armed = False
            raise Died()
        return super().put(config, checkpoint, metadata, new_versions)


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "background"])
def test_a_reply_saved_without_its_checkpoint_is_kept_and_its_turn_extracted(store, inline):
    recorder = Recorder()
    recorder.background = not inline
    model = ScriptedChatModel(script=[AIMessage("记住了"), AIMessage("在的")])
    saver = DiesAfterTheReply()
    graph = build_graph(make_config(model, memory=store, extractor=recorder), saver)
    with pytest.raises(Died):
        graph.invoke({"messages": [HumanMessage("我叫小林", id="u1")]}, thread("t"))
    graph.invoke({"messages": [HumanMessage("在吗", id="u2")]}, thread("t"))
    assert wait_for_extractions(10)
    said = [(m.type, m.content) for m in graph.get_state(thread("t")).values["messages"]]
    assert said == [("human", "我叫小林"), ("ai", "记住了"), ("human", "在吗"), ("ai", "在的")]
    assert set(remembered(store)) == {"记得「我叫小林」", "记得「在吗」"}
    assert len(model.requests) == 2, "the dead turn's reply is kept, not asked for again"


def test_a_reply_to_a_stranger_never_reaches_an_extractor():
    """The persona may repeat what a stranger said: its reply in a restricted turn goes with
    the words it answers, even in a transcript that mixes sessions (saved before a thread
    was bound to one actor), and an owner turn after it reads only the owner's own."""
    stranger = annotated(HumanMessage("主人欠我一万块", name="小明"), restricted=True)
    messages = [
        stranger,
        AIMessage("小明说主人欠他一万块"),
        HumanMessage("记住 我喜欢猫"),
        AIMessage("好"),
    ]
    assert [m.content for m in extractable(messages)] == ["记住 我喜欢猫", "好"]
