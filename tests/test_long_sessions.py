"""Sessions that live for months (issue 20): compaction on by default, the transcript archive,
the whole transcript readable page by page, and sessions written before the archive migrated."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage

from graph import Compaction, LoopConfig, Persona, build_graph, open_checkpointer
from nodes.compaction.policy import context_budget
from nodes.compaction.settings import AUTO_FALLBACK, AUTO_SHARE
from nodes.kernel.messages import message_text
from nodes.recall.block import RECALL_HEADER
from tests.cli_support import cyrene
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel

BEFORE_ARCHIVE = Path(__file__).with_name("data") / "session_before_archive.db.gz"
"""A SQLite checkpoint file written by the version before the archive: one thread `old`, 30
turns (60 messages) with `max_context_tokens=400`, its summary covering the first ones."""


def echo(messages) -> AIMessage:
    return AIMessage("收到：" + str(messages[-1].content)[:20])


def chat(graph, name: str, turns: int, start: int = 0) -> None:
    for n in range(start, start + turns):
        graph.invoke(
            {"messages": [HumanMessage(f"第{n}句：今天过得怎么样？", id=f"h{n}")]}, thread(name)
        )


def saver_url(kind: str, tmp_path: Path, request) -> str:
    if kind == "postgres":
        return request.getfixturevalue("fresh_postgres_url")
    return "memory" if kind == "memory" else f"sqlite:///{tmp_path}/long.db"


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_what_the_summary_covers_moves_to_the_archive_and_the_transcript_stays_whole(
    tmp_path, request, kind
):
    model = ScriptedChatModel(script=[echo] * 60)
    with open_checkpointer(saver_url(kind, tmp_path, request)) as saver:
        graph = build_graph(
            make_config(model, features=[Compaction(max_context_tokens=300)]), saver
        )
        chat(graph, "long", 30)
        values = graph.get_state(thread("long")).values
        whole = graph.transcript(thread("long"))
        pages = [graph.transcript(thread("long"), start, start + 7) for start in range(0, 60, 7)]
    archived = values["archived"]["messages"]
    assert archived > 0 and len(values["messages"]) == 60 - archived
    assert [m.id for m in whole if m.type == "human"] == [f"h{n}" for n in range(30)]
    assert [m.type for m in whole] == ["human", "ai"] * 30
    assert whole[archived:] == values["messages"], "the archive, then the live window"
    assert [m for page in pages for m in page] == whole
    assert values["archived"]["humans"] == sum(m.type == "human" for m in whole[:archived])
    assert len({m.id for m in whole}) == 60


async def test_the_transcript_reads_the_same_awaited(tmp_path):
    model = ScriptedChatModel(script=[echo] * 40)
    async with open_checkpointer(f"sqlite:///{tmp_path}/a.db") as saver:
        graph = build_graph(
            make_config(model, features=[Compaction(max_context_tokens=300)]), saver
        )
        for n in range(20):
            await graph.ainvoke({"messages": [HumanMessage(f"第{n}句", id=f"h{n}")]}, thread("a"))
        whole = await graph.atranscript(thread("a"))
        page = await graph.atranscript(thread("a"), 5, 9)
        archived = (await graph.aget_state(thread("a"))).values["archived"]["messages"]
    assert len(whole) == 40 and page == whole[5:9] and archived > 0


def test_a_step_run_again_after_a_failure_archives_the_same_messages_once(tmp_path):
    """The archive is written inside `call_model`'s attempt; when the model then fails, the
    resumed attempt compacts and archives again, at the same positions, and nothing doubles."""
    from nodes.compaction.summary import StructuralCompactor

    class Counting(StructuralCompactor):
        runs = 0

        def compact(self, *args, **kwargs):
            Counting.runs += 1
            return super().compact(*args, **kwargs)

    failed = []

    def reply(messages) -> AIMessage:
        if Counting.runs == 2 and not failed:  # the attempt that compacted a second time
            failed.append(True)
            raise RuntimeError("the provider went away mid-turn")
        return echo(messages)

    model = ScriptedChatModel(script=[reply] * 40)
    config = make_config(
        model, retry=None, features=[Compaction(max_context_tokens=300, compactor=Counting())]
    )
    with open_checkpointer(f"sqlite:///{tmp_path}/r.db") as saver:
        graph = build_graph(config, saver)
        for n in range(20):
            try:
                chat(graph, "r", 1, start=n)
            except RuntimeError:
                graph.invoke(None, thread("r"))  # resume the failed turn
        whole = graph.transcript(thread("r"))
    assert failed and Counting.runs >= 3, "a compaction attempt failed and was run again"
    assert [m.id for m in whole if m.type == "human"] == [f"h{n}" for n in range(20)]
    assert len({m.id for m in whole}) == len(whole) == 40


def test_a_session_written_before_the_archive_opens_migrates_once_and_continues(tmp_path):
    db = tmp_path / "old.db"
    with gzip.open(BEFORE_ARCHIVE) as packed, db.open("wb") as out:
        shutil.copyfileobj(packed, out)
    model = ScriptedChatModel(script=[echo] * 4)
    config = LoopConfig(
        model=model,
        personas={"xilian": Persona(name="昔涟")},
        default_persona="xilian",
        features=[Compaction(max_context_tokens=400)],
    )
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(config, saver)
        before = graph.transcript(thread("old"))
        assert len(before) == 60 and "archived" not in graph.get_state(thread("old")).values
        chat(graph, "old", 1, start=30)
        migrated = graph.get_state(thread("old")).values
        chat(graph, "old", 1, start=31)
        after = graph.get_state(thread("old")).values
        whole = graph.transcript(thread("old"))
    assert migrated["archived"]["messages"] > 0, "the covered messages moved on the first turn"
    assert after["archived"]["messages"] >= migrated["archived"]["messages"]
    assert [m.id for m in whole[:60]] == [m.id for m in before]
    assert [m.id for m in whole if m.type == "human"] == [f"h{n}" for n in range(32)]
    assert len({m.id for m in whole}) == len(whole) == 64


def test_cyrene_history_shows_the_whole_transcript_or_its_last_messages(tmp_path, capsys):
    model = ScriptedChatModel(script=[echo] * 30)
    with open_checkpointer(f"sqlite:///{tmp_path}/checkpoints.db") as saver:
        graph = build_graph(
            make_config(model, features=[Compaction(max_context_tokens=300)]), saver
        )
        chat(graph, "long", 30)
        assert graph.get_state(thread("long")).values["archived"]["messages"] > 10
    data = ("--data", str(tmp_path))
    whole = cyrene(capsys, "history", "long", *data).out.splitlines()
    last = cyrene(capsys, "history", "long", "--last", "5", *data).out.splitlines()
    assert [line.split()[-1] for line in whole[:2]] == [
        "第0句：今天过得怎么样？",
        "收到：第0句：今天过得怎么样？",
    ]
    assert len(whole) == 60 and last == whole[-5:], "the archive, then the live window"
    assert cyrene(capsys, "history", "long", "--last", "0", *data).code == 2


def test_compaction_is_on_by_default_and_takes_half_the_models_input_window():
    model = ScriptedChatModel(script=[echo] * 120, profile={"max_input_tokens": 8000})
    config = make_config(model)
    assert config.feature(Compaction).max_context_tokens == "auto"
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        for n in range(100):
            long = f"第{n}句：" + "今天的天气很好，我们出去走走吧。" * 20
            graph.invoke({"messages": [HumanMessage(long, id=f"h{n}")]}, thread("auto"))
        values = graph.get_state(thread("auto")).values
    budget = int(8000 * AUTO_SHARE)
    from langchain_core.messages.utils import count_tokens_approximately

    # The memory block (here the recalled conversation: no store) is outside the budget, as
    # the memory block always was (`AUTO_SHARE`); `ConversationRecall.max_tokens` bounds it.
    sent = [
        count_tokens_approximately([m for m in r.messages if RECALL_HEADER not in message_text(m)])
        for r in model.requests
    ]
    assert values["summary"] and values["archived"]["messages"] > 0
    assert max(sent) <= budget, "compacted before the view passed the budget"
    assert max(sent) > budget // 2, "and not long before"


def test_a_model_without_a_profile_gets_the_fallback_budget():
    from nodes.core.loop import Loop

    model = ScriptedChatModel(script=[])
    small = ScriptedChatModel(script=[], profile={"max_input_tokens": 2000})
    personas = {"xilian": Persona(name="昔涟"), "tiny": Persona(name="小", model=small)}
    loop = Loop.from_config(LoopConfig(model=model, personas=personas, default_persona="xilian"))
    assert context_budget(loop, "xilian") == AUTO_FALLBACK
    assert context_budget(loop, "tiny") == 1000, "the persona's own model decides"
    off = Loop.from_config(LoopConfig(model=model, features=[Compaction(max_context_tokens=0)]))
    assert context_budget(off, None) == 0


def test_the_archive_never_takes_a_call_from_its_results():
    from langchain_core.tools import tool

    from tests.scripted import call, tool_calls

    @tool
    def lookup(key: str) -> str:
        """Looks a key up."""
        return "值" * 40

    script = []
    for n in range(12):
        script += [tool_calls(call("lookup", f"c{n}", key=str(n))), AIMessage(f"答{n}")]
    model = ScriptedChatModel(script=script)
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(model, tools=[lookup], features=[Compaction(max_context_tokens=300)]), saver
        )
        chat(graph, "calls", 12)
        window = graph.get_state(thread("calls")).values["messages"]
    calls = {c["id"] for m in window if isinstance(m, AIMessage) for c in m.tool_calls}
    results = [m.tool_call_id for m in window if m.type == "tool"]
    assert window[0].type != "tool" and set(results) <= calls, "no result without its call"
    assert len(window) < 12 * 4 and not any(isinstance(m, RemoveMessage) for m in window)
