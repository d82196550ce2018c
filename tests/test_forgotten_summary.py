"""A summary written before a forget is written again without the forgotten turn: the
next request's summary holds none of its words, the rest of what it held stays, and an
`LLMCompactor` is asked to summarise the kept messages, never the old summary. The
rewrite is saved with the session, so it happens once.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage

from graph import Compaction, ManualExtractor, ModelView, build_graph, open_checkpointer
from graph.storage.archive import ProcessArchive
from memory import MemoryStore
from nodes.compaction.summary import LLMCompactor
from nodes.kernel.messages import message_text
from tests.conftest import make_config, thread
from tests.scripted import Request, ScriptedChatModel
from tests.test_compaction import summary_of
from tests.test_forgotten_turns import FACT, SECRET, EchoModel, extracted, said

BUDGET = 400
SISTER = "我妹妹三月去大理学陶艺了。"
CHAT = "第{}句闲聊，今天天气很好。"


def talk(graph, model) -> str:
    """Small talk, the fact, the sister, and small talk until a summary is written (it covers
    the fact and the sister)."""
    for n in range(4):
        said(graph, CHAT.format(n))
    said(graph, FACT)
    said(graph, SISTER)
    for n in range(4, 30):
        said(graph, CHAT.format(n))
        if summary := summary_sent(model):
            return summary
    raise AssertionError("no summary was written")


def graph_with(model, store, saver, compactor=None, *, own_step=False):
    config = make_config(
        model,
        memory=store,
        extractor=ManualExtractor(),
        features=[
            Compaction(max_context_tokens=BUDGET, compactor=compactor),
            ModelView(own_step=own_step),
        ],
    )
    return build_graph(config, saver)


def summary_sent(model) -> str:
    return summary_of(model.requests[-1].messages) or ""


def everything_sent(model) -> str:
    return "\n".join(message_text(m) for m in model.requests[-1].messages)


class Summariser(ScriptedChatModel):
    """Writes a faithful summary: the lines it already had and the new ones, the newest 24;
    `failing`: every request fails."""

    failing: bool = False

    def _next(self, messages: list[BaseMessage], kwargs) -> AIMessage:
        with self._lock:
            self._requests.append(Request(list(messages), dict(kwargs)))
        if self.failing:
            raise RuntimeError("the summariser is down")
        body = message_text(messages[-1])
        previous, new = body.removeprefix("已有摘要：\n").split("\n\n新增对话：\n", 1)
        lines = [] if previous == "（无）" else previous.splitlines()
        return AIMessage("\n".join([*lines, *new.splitlines()][-24:]))


@pytest.mark.parametrize("own_step", [False, True], ids=["in call_model", "compact step"])
def test_a_summary_written_before_the_forget_is_rewritten_without_the_turn(tmp_path, own_step):
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, own_step=own_step)
        before = talk(graph, model)
        assert SECRET in before and "大理" in before, "the summary covers the fact's turn"
        assert store.forget(extracted(store))
        said(graph, "还记得我说过什么吗？")
        view, shown = everything_sent(model), summary_sent(model)
        saved = graph.get_state(thread("owner")).values["summary"]["text"]
    assert SECRET not in view
    assert "大理" in shown and "第4句闲聊" in shown, "the rest of the summary stays"
    assert SECRET not in saved, "the rewrite is saved with the session"


def test_an_llm_compactor_resummarises_the_kept_messages_not_the_old_summary(tmp_path):
    model = EchoModel()
    summariser = Summariser()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, LLMCompactor(summariser))
        assert SECRET in talk(graph, model), "the summary covers the fact's turn"
        asked_before = len(summariser.requests)
        assert store.forget(extracted(store))
        said(graph, "还记得我说过什么吗？")
        view, shown = everything_sent(model), summary_sent(model)
        restarted = graph_with(model, store, saver, LLMCompactor(summariser))
        said(restarted, "今天就聊到这里。")
        later = everything_sent(model)
    asked = [message_text(r.messages[-1]) for r in summariser.requests[asked_before:]]
    assert asked and all(SECRET not in body for body in asked)
    assert sum(body.startswith("已有摘要：\n（无）") for body in asked) == 1, (
        "rewritten once, and saved"
    )
    assert SECRET not in view and SECRET not in later
    assert "大理" in shown and "第4句闲聊" in shown, "the rest of the summary stays"
    assert "用户］ 我妹妹三月去大理" in shown, "written by the model, not a structural stand-in"


def test_a_failing_llm_compactor_falls_back_to_a_summary_without_the_turn(tmp_path):
    model = EchoModel()
    summariser = Summariser()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver, LLMCompactor(summariser))
        assert SECRET in talk(graph, model), "the summary covers the fact's turn"
        summariser.failing = True
        assert store.forget(extracted(store))
        said(graph, "还记得我说过什么吗？")
        view, shown = everything_sent(model), summary_sent(model)
    assert SECRET not in view
    assert "大理" in shown, "the structural summary of the kept messages stands in"


def test_with_compaction_turned_off_a_summary_from_before_the_forget_is_not_shown(tmp_path):
    """Nothing rewrites a summary once compaction is off: one written before the forget is
    left out of the view rather than shown as it is."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        assert SECRET in talk(graph_with(model, store, saver), model)
        config = make_config(
            model,
            memory=store,
            extractor=ManualExtractor(),
            features=[Compaction(max_context_tokens=0)],
        )
        graph = build_graph(config, saver)
        said(graph, "还在吗？")
        assert "大理" in summary_sent(model), "the summary is shown before the forget"
        assert store.forget(extracted(store))
        said(graph, "还记得我说过什么吗？")
    assert SECRET not in everything_sent(model)


def test_while_the_archive_cannot_be_read_no_summary_is_shown(tmp_path, monkeypatch):
    """What the summary covers is in the archive: while it cannot be read, no summary is
    shown; once it can, the summary is rewritten without the turn."""
    model = EchoModel()
    with MemoryStore.open(tmp_path / "memory") as store, open_checkpointer("memory") as saver:
        graph = graph_with(model, store, saver)
        assert SECRET in talk(graph, model), "the summary covers the fact's turn"
        assert store.forget(extracted(store))
        with monkeypatch.context() as down:
            down.setattr(ProcessArchive, "read", unreadable)
            said(graph, "还记得我说过什么吗？")
            failing, shown_failing = everything_sent(model), summary_sent(model)
        said(graph, "现在呢？")
        shown = summary_sent(model)
    assert SECRET not in failing and shown_failing == ""
    assert SECRET not in shown and "大理" in shown


def unreadable(self, thread, start: int, stop: int) -> list[BaseMessage]:
    raise OSError("the archive's disk is gone")
