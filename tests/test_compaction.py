"""Compaction: exact trigger, tool pairs never split, transcript intact, summaries keep speakers."""

from __future__ import annotations

import re
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately

from graph import Compaction, ConversationRecall, SessionEnv, build_graph, open_checkpointer
from nodes.boundary.admission import Trusted
from nodes.compaction import summary
from nodes.compaction.summary import LLMCompactor, plan_cut
from nodes.context.summary import SUMMARY_PREFIX
from nodes.kernel.transcript import turn_start
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


def history(turns: int, *, persona: str | None = "xilian", nick: str | None = None) -> list:
    messages = []
    for i in range(turns):
        messages.append(HumanMessage(f"第{i}个问题，" + "内容" * 20, id=f"h{i}", name=nick))
        messages.append(AIMessage(f"第{i}个回答\n细节" + "很长" * 20, id=f"a{i}", name=persona))
    messages.append(HumanMessage("最新的问题", id="latest", name=nick))
    return messages


def summary_of(view) -> str | None:
    return next(
        (
            m.content
            for m in view
            if isinstance(m, SystemMessage) and m.content.startswith(SUMMARY_PREFIX)
        ),
        None,
    )


def run(messages, budget, compactor=None, **overrides):
    model = ScriptedChatModel(script=[AIMessage("好")])
    env = overrides.pop("env", SessionEnv())
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(
                model,
                **overrides,
                # Recall off: like the memory block, its block is outside the budget, and
                # the round that archives can recall at once (tests/test_conversation_recall.py).
                features=[
                    Compaction(max_context_tokens=budget, compactor=compactor),
                    ConversationRecall(max_tokens=0),
                ],
            ),
            saver,
        )
        out = graph.invoke(Trusted({"messages": messages}), thread("c"), context=env)
        out = {**out, "transcript": graph.transcript(thread("c"))}
    return model.requests[0].messages, out


def test_compaction_triggers_exactly_when_over_budget():
    messages = history(12)
    uncompacted, _ = run(messages, 0)
    exact = count_tokens_approximately(uncompacted)
    at_budget, _ = run(messages, exact)
    over_budget, _ = run(messages, exact - 1)
    assert at_budget == uncompacted and summary_of(at_budget) is None
    assert summary_of(over_budget) is not None
    assert over_budget[-1].content == "最新的问题"
    assert count_tokens_approximately(over_budget) <= exact - 1


def test_the_budget_check_counts_a_message_once_and_as_langchain_would(monkeypatch):
    """The check before every round counts the same window again and again: each message's
    estimate is remembered, and their sum is LangChain's estimate of the whole list."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        *history(3, nick="小明"),
        AIMessage("", tool_calls=[call("lookup", "c1", q="天气")], id="c"),
        ToolMessage("晴", tool_call_id="c1", name="lookup", id="r"),
        HumanMessage([{"type": "text", "text": "看这张"}, image], id="img"),
    ]
    langchain_estimate = summary.count_tokens_approximately
    counted: list = []

    def counting(batch, **kwargs):
        counted.extend(batch)
        return langchain_estimate(batch, **kwargs)

    monkeypatch.setattr(summary, "count_tokens_approximately", counting)
    estimate = summary.token_counter(ScriptedChatModel(script=[]))
    assert estimate(messages) == langchain_estimate(messages)
    assert estimate(messages[2:]) == langchain_estimate(messages[2:])
    assert len(counted) == len(messages)  # each message counted once, however often asked


def test_the_transcript_is_never_shortened():
    """What the summary covers leaves the checkpointed window for the archive; the whole
    transcript is the archive followed by the window."""
    messages = history(12)
    view, out = run(messages, 300)
    assert [m.id for m in out["transcript"][:-1]] == [m.id for m in messages]
    assert out["summary"]["upto"] in {m.id for m in messages}
    assert len(view) < len(messages)
    archived = out["archived"]["messages"]
    assert archived > 0 and out["messages"] == out["transcript"][archived:]


def test_structural_summary_keeps_who_said_what():
    view, _ = run(history(10, nick="小明", persona=None), 300, env=SessionEnv(actor="group"))
    # Which turns the summary still holds depends on the cut and the summary's bound; every
    # line it holds names its speaker.
    assert said(summary_of(view)) == {"- 「小明」：第N个问题", "- 「昔涟」（xilian）：第N个回答"}, (
        "unlabelled replies in a group are the persona's"
    )
    owner_summary = summary_of(run(history(10), 300)[0])
    assert said(owner_summary) == {"- 用户：第N个问题", "- 「昔涟」（xilian）：第N个回答"}


def said(summary: str) -> set[str]:
    """The summary's lines as speaker and kind of message, the turn's number as N."""
    lines = summary.removeprefix(SUMMARY_PREFIX).splitlines()
    return {re.sub(r"第\d+个", "第N个", line.split("，")[0]) for line in lines}


def test_a_failing_or_empty_compactor_leaves_the_view_whole(caplog):
    class Broken:
        def compact(self, *args):
            raise RuntimeError("summariser down")

    class Empty:
        def compact(self, *args):
            return "  "

    messages = history(12)
    for compactor, words in ((Broken(), "compactor failed"), (Empty(), "returned nothing")):
        view, out = run(messages, 300, compactor=compactor)
        assert summary_of(view) is None and [m.id for m in view if m.id] == [m.id for m in messages]
        assert out["messages"][-1].content == "好"
        assert words in caplog.text


def test_llm_compactor_summarises_only_what_is_new():
    summariser = ScriptedChatModel(script=[AIMessage("摘要一"), AIMessage("摘要二")])
    model = ScriptedChatModel(script=[AIMessage("好"), AIMessage("好")])
    config = make_config(
        model, features=[Compaction(max_context_tokens=260, compactor=LLMCompactor(summariser))]
    )
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        graph.invoke(Trusted({"messages": history(8)}), thread("l"))
        more = [HumanMessage(f"新问题{i}" + "字" * 40, id=f"n{i}") for i in range(6)]
        extra = []
        for m in more[:-1]:
            extra += [m, AIMessage("新回答" + "字" * 40, id=f"r{m.id}")]
        graph.invoke(Trusted({"messages": [*extra, more[-1]]}), thread("l"))
    first, second = (r.messages[1].content for r in summariser.requests)
    assert first.startswith("已有摘要：\n（无）") and "[用户] 第0个问题" in first
    assert (
        second.startswith("已有摘要：\n摘要一")
        and "第0个问题" not in second
        and "新问题0" in second
    )
    assert summary_of(model.requests[1].messages) == SUMMARY_PREFIX + "摘要二"


def test_tool_results_stay_with_their_call_in_the_kept_tail():
    messages = history(6)
    model = ScriptedChatModel(script=[tool_calls(call("get_time", "t1")), AIMessage("八点半")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(model, features=[Compaction(max_context_tokens=200)]), saver
        )
        graph.invoke(Trusted({"messages": messages}), thread("t"))
    second = model.requests[1].messages
    kinds = [type(m).__name__ for m in second if not isinstance(m, SystemMessage)]
    assert kinds[-3:] == ["HumanMessage", "AIMessage", "ToolMessage"]


# -- property: a cut never separates a tool call from its results ---------------------


@st.composite
def transcripts(draw):
    messages = []
    for t in range(draw(st.integers(1, 6))):
        messages.append(HumanMessage(f"q{t}", id=f"h{t}"))
        for r in range(draw(st.integers(0, 3))):
            calls = [call("get_time", f"c{t}-{r}-{k}") for k in range(draw(st.integers(1, 3)))]
            messages.append(AIMessage("", tool_calls=calls, id=f"a{t}-{r}"))
            messages += [ToolMessage("x", tool_call_id=c["id"], id=f"m{c['id']}") for c in calls]
        if draw(st.booleans()):
            messages.append(AIMessage(f"reply {t}", id=f"f{t}"))
    sizes = draw(st.lists(st.integers(1, 50), min_size=len(messages), max_size=len(messages)))
    start = draw(st.integers(0, len(messages) - 1))
    budget = draw(st.integers(0, 400))
    return messages, sizes, start, budget


@settings(max_examples=300, deadline=None)
@given(transcripts())
def test_plan_cut_never_splits_a_tool_call_from_its_results(case):
    messages, sizes, start, budget = case
    cut = plan_cut(messages, start, budget, sizes)
    if cut is None:
        return
    assert start < cut <= turn_start(messages), "the tail keeps the latest user message"
    assert not isinstance(messages[cut], ToolMessage)
    head_ids = {c["id"] for m in messages[:cut] if isinstance(m, AIMessage) for c in m.tool_calls}
    tail_results = {m.tool_call_id for m in messages[cut:] if isinstance(m, ToolMessage)}
    assert not head_ids & tail_results
    if sum(sizes[cut:]) > budget:
        later = [
            i
            for i in range(cut + 1, turn_start(messages) + 1)
            if not isinstance(messages[i], ToolMessage)
        ]
        assert later == [], "an over-budget tail means no later legal cut exists"


class CharCountingModel(ScriptedChatModel):
    """Counts a token per character, as Claude's counter does for Chinese text (LangChain's
    estimate counts four characters a token)."""

    def get_num_tokens_from_messages(self, messages, tools=None) -> int:
        return sum(len(str(m.content)) for m in messages)


def test_a_structural_summary_fits_its_share_under_a_counter_that_counts_cjk_as_tokens():
    """A summary over its share leaves the view over budget after compaction, so every
    later turn compacts again (and no request reuses the provider's cached prefix)."""
    model = CharCountingModel(
        script=[AIMessage(f"好的，第{i}句我听到了，" + "嗯" * 12) for i in range(24)]
    )
    covered = []
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(model, features=[Compaction(max_context_tokens=900)]), saver
        )
        for i in range(24):
            said = HumanMessage(f"第{i}句：" + "今天的事情" * 5)
            values = graph.invoke({"messages": [said]}, thread("cjk"))
            covered.append((values.get("summary") or {}).get("upto"))
    compacting_turns = [i for i in range(1, 24) if covered[i] != covered[i - 1]]
    assert compacting_turns, "the budget is small enough that compaction fires"
    assert all(b - a > 1 for a, b in pairwise(compacting_turns)), compacting_turns
