"""Durable sessions: savers, resume after SIGKILL, interrupted threads, checkpoint growth."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from graph import ToolCalls, build_graph, open_checkpointer
from tests.conftest import REPO, human, make_config, owner, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


def echo_model(n: int = 50) -> ScriptedChatModel:
    def echo(messages):
        humans = [m.content for m in messages if m.type == "human"]
        return AIMessage(f"你说了 {len(humans)} 句，上一句：{humans[-1]}")

    return ScriptedChatModel(script=[echo] * n)


def two_turns(graph, name: str = "s1") -> list:
    graph.invoke({"messages": [human("第一句", id="a")]}, thread(name), context=owner())
    return graph.invoke({"messages": [human("第二句", id="b")]}, thread(name), context=owner())[
        "messages"
    ]


async def two_turns_async(graph, name: str = "s1") -> list:
    await graph.ainvoke({"messages": [human("第一句", id="a")]}, thread(name), context=owner())
    return (
        await graph.ainvoke({"messages": [human("第二句", id="b")]}, thread(name), context=owner())
    )["messages"]


def test_sqlite_sessions_survive_reopening(tmp_path):
    url = f"sqlite:///{tmp_path}/deep/ckpt.db"
    with open_checkpointer(url) as saver:
        build_graph(make_config(echo_model()), saver).invoke(
            {"messages": [human("第一句", id="a")]}, thread("s")
        )
    with open_checkpointer(url) as saver:
        out = build_graph(make_config(echo_model()), saver).invoke(
            {"messages": [human("第二句", id="b")]}, thread("s")
        )
    assert out["messages"][-1].content == "你说了 2 句，上一句：第二句"
    assert [m.content for m in out["messages"] if m.type == "human"] == ["第一句", "第二句"]


def test_in_memory_saver_keeps_threads_apart():
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(echo_model()), saver)
        messages = two_turns(graph, "one")
        other = graph.invoke({"messages": [human("别处", id="c")]}, thread("two"))["messages"]
    assert messages[-1].content == "你说了 2 句，上一句：第二句"
    assert other[-1].content == "你说了 1 句，上一句：别处"


@pytest.mark.parametrize("url", ["memory", "sqlite"])
async def test_async_savers(tmp_path, url):
    url = "memory" if url == "memory" else f"sqlite:///{tmp_path}/a.db"
    async with open_checkpointer(url) as saver:
        messages = await two_turns_async(build_graph(make_config(echo_model()), saver))
    assert messages[-1].content == "你说了 2 句，上一句：第二句"


@pytest.mark.services
def test_postgres_saver(postgres_url):
    thread_name = f"pg-{time.time_ns()}"
    with open_checkpointer(postgres_url) as saver:
        messages = two_turns(build_graph(make_config(echo_model()), saver), thread_name)
    with open_checkpointer(postgres_url) as saver:
        state = build_graph(make_config(echo_model()), saver).get_state(thread(thread_name))
    assert messages[-1].content == "你说了 2 句，上一句：第二句"
    assert len(state.values["messages"]) == 4


@pytest.mark.services
async def test_async_postgres_saver(postgres_url):
    async with open_checkpointer(postgres_url) as saver:
        messages = await two_turns_async(
            build_graph(make_config(echo_model()), saver), f"apg-{time.time_ns()}"
        )
    assert messages[-1].content == "你说了 2 句，上一句：第二句"


def test_bad_checkpoint_url_is_rejected():
    with pytest.raises(ValueError, match="expected 'memory'"):
        open_checkpointer("redis://localhost")


def test_token_streaming_with_a_saver(tmp_path):
    model = ScriptedChatModel(script=[AIMessage("一二三四五")], stream_chunks=True)
    with open_checkpointer(f"sqlite:///{tmp_path}/s.db") as saver:
        graph = build_graph(make_config(model), saver)
        pieces = [
            c.content
            for c, meta in graph.stream(
                {"messages": [human("hi")]}, thread("s"), stream_mode="messages"
            )
            if isinstance(c, AIMessageChunk) and meta["langgraph_node"] == "call_model"
        ]
    assert (
        "".join(p if isinstance(p, str) else "".join(b.get("text", "") for b in p) for p in pieces)
        == "一二三四五"
    )
    assert len(pieces) >= 5


# -- crash and resume ------------------------------------------------------------


def worker(
    db: Path,
    log: Path,
    mode: str,
    execution: str,
    *,
    hang: bool,
    slow_saves: float = 0,
    durability: str = "",
) -> subprocess.Popen:
    env = {
        **os.environ,
        "HANG": "1" if hang else "0",
        "SLOW_SAVES": str(slow_saves),
        "DURABILITY": durability,
        "PYTHONPATH": str(REPO),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", str(db), str(log), mode, execution],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def saved_result(db: Path, needle: bytes, timeout: float) -> bool:
    """Whether a pending write holding `needle` is in the checkpoint database yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError), sqlite3.connect(db) as conn:
            if any(needle in bytes(v) for (v,) in conn.execute("select value from writes")):
                return True
        time.sleep(0.05)
    return False


def kill_inside_slow_tool(folder: Path, execution: str, **settings: Any) -> tuple[Path, Path]:
    """Start a turn, SIGKILL it inside the second tool once the first tool's result is saved."""
    db, log = folder / "crash.db", folder / "tools.log"
    proc = worker(db, log, "start", execution, hang=True, **settings)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if "slow start" in lines and "quick k" in lines:
            break
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the worker never reached the slow tool")
    assert saved_result(db, b"value of k", timeout=10), (
        "the finished call's result reaches the saver"
    )
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    return db, log


def crash_and_resume(folder: Path, execution: str, **settings: Any) -> tuple[Path, list[str], str]:
    """Kill a turn inside its second tool and resume it in a new process: the
    database, the tool log after, and what the resuming process printed."""
    db, log = kill_inside_slow_tool(folder, execution, **settings)
    resumed = worker(db, log, "resume", execution, hang=False, **settings)
    output = resumed.communicate(timeout=60)[0].decode()
    return db, log.read_text().splitlines(), output


def resumed_exactly(lines: list[str]) -> bool:
    """The finished call ran once, the interrupted one twice, and the turn finished."""
    return lines.count("quick k") == 1 and lines.count("slow start") == 2 and "finished" in lines


def transcript(db: Path) -> list:
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(make_config(echo_model()), saver)
        return graph.get_state(thread("crash")).values["messages"]


@pytest.mark.slow
@pytest.mark.parametrize("slow_saves", [0, 0.3], ids=["fast-saver", "lagging-saver"])
@pytest.mark.parametrize("execution", ["parallel", "sequential"])
def test_resume_after_sigkill_inside_a_tool_finishes_the_turn(tmp_path, execution, slow_saves):
    db, lines, output = crash_and_resume(tmp_path, execution, slow_saves=slow_saves)
    assert "finished" in lines, output
    assert lines.count("quick k") == 1, "the finished call is not run again"
    assert lines.count("slow start") == 2, "the call that was running is run again"
    messages = transcript(db)
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage"]
    assert [m.tool_call_id for m in messages if isinstance(m, ToolMessage)] == ["call-1", "call-2"]
    assert messages[-1].content == "都查好了：value of k，report on t"


@pytest.mark.slow
def test_new_message_on_an_interrupted_thread_closes_the_dangling_calls(tmp_path):
    db, log = kill_inside_slow_tool(tmp_path, "parallel")
    newer = worker(db, log, "new", "parallel", hang=False)
    output = newer.communicate(timeout=60)[0].decode()
    assert newer.returncode == 0, output

    sent = next(line for line in log.read_text().splitlines() if line.startswith("sent "))
    assert "ai: | tool:call-1 | tool:call-2 | human:" in sent, (
        "the provider never sees a dangling call"
    )
    messages = transcript(db)
    closed = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in closed] == ["call-1", "call-2"]
    assert all(m.status == "error" and m.content.startswith("interrupted") for m in closed)
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [
        "查一下",
        "算了，换个话题",
    ]


# -- checkpoint growth ---------------------------------------------------------------


def test_checkpoint_bytes_per_turn_do_not_grow_with_the_session(tmp_path):
    db = tmp_path / "growth.db"
    model = ScriptedChatModel(
        script=[tool_calls(call("get_time", "c")), AIMessage("现在八点半，" * 20)] * 60
    )
    sizes = []
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(make_config(model), saver)
        for turn in range(60):
            graph.invoke({"messages": [HumanMessage("几点了？" * 20, id=f"m{turn}")]}, thread("g"))
            with sqlite3.connect(db) as conn:
                sizes.append(
                    sum(
                        conn.execute(
                            "select coalesce(sum(length(checkpoint)),0) + coalesce(sum(length(metadata)),0) from checkpoints"
                        ).fetchone()
                    )
                    + conn.execute("select coalesce(sum(length(value)),0) from writes").fetchone()[
                        0
                    ]
                )
    per_turn = [b - a for a, b in pairwise(sizes)]
    early, late = sum(per_turn[:10]) / 10, sum(per_turn[-10:]) / 10
    assert late < early * 1.5, f"bytes per turn grew from {early:.0f} to {late:.0f}"


def test_resume_when_the_crash_beat_the_next_checkpoint(tmp_path):
    """A task's writes were saved but the checkpoint after them was not (checkpoints
    are written in the background): `next` is empty, yet the turn must resume."""
    from langchain_core.tools import tool

    runs = []

    @tool
    def quick_lookup(key: str) -> str:
        """Fast."""
        runs.append(key)
        return f"value of {key}"

    db, cfg = tmp_path / "race.db", thread("race")
    batch = tool_calls(call("quick_lookup", "c1", key="k"), call("quick_lookup", "c2", key="j"))
    script = [batch, AIMessage("好了")]
    config = make_config(
        ScriptedChatModel(script=script),
        tools=[quick_lookup],
        features=[ToolCalls(execution="sequential")],
    )
    with open_checkpointer(f"sqlite:///{db}") as saver:
        build_graph(config, saver).invoke({"messages": [human("查", id="u")]}, cfg)
    with sqlite3.connect(db) as conn:
        [(first_write,)] = conn.execute(
            "select min(checkpoint_id) from writes where instr(value, cast('value of k' as blob)) > 0"
        ).fetchall()
        conn.execute("delete from checkpoints where checkpoint_id > ?", (first_write,))
        conn.execute("delete from writes where checkpoint_id > ?", (first_write,))
    runs.clear()
    config = config.model_copy(update={"model": ScriptedChatModel(script=[AIMessage("好了")])})
    with open_checkpointer(f"sqlite:///{db}") as saver:
        graph = build_graph(config, saver)
        assert graph.get_state(cfg).next == (), "the window this test recreates"
        out = graph.invoke(None, cfg)
    assert runs == ["j"], "the call whose result was saved is not run again"
    assert [type(m).__name__ for m in out["messages"]] == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage",
    ]  # fmt: skip


class LaggingSaver(InMemorySaver):
    """Saves each checkpoint 0.2 s late, as a loaded disk or a remote database does."""

    def put(self, *args, **kwargs):
        time.sleep(0.2)
        return super().put(*args, **kwargs)

    async def aput(self, *args, **kwargs):
        await asyncio.sleep(0.2)
        return super().put(*args, **kwargs)


def graph_that_checks_its_saver() -> tuple[Any, list[bool]]:
    """A one-tool turn whose tool records whether the model's request for it was saved."""
    from langchain_core.tools import tool

    saver, seen = LaggingSaver(), []

    @tool
    def quick_lookup(key: str) -> str:
        """Fast."""
        saved = graph.get_state(thread("lag")).values.get("messages", [])
        seen.append(any(c["id"] == "c1" for m in saved for c in getattr(m, "tool_calls", [])))
        return f"value of {key}"

    model = ScriptedChatModel(
        script=[tool_calls(call("quick_lookup", "c1", key="k")), AIMessage("好")]
    )
    graph = build_graph(make_config(model, tools=[quick_lookup]), saver)
    return graph, seen


@pytest.mark.parametrize(
    ("durability", "saved_first"), [(None, True), ("sync", True), ("async", False)]
)
def test_a_tool_starts_only_once_the_model_step_is_saved(durability, saved_first):
    """The default durability is `sync`: a crash inside a tool can never lose the
    model's request for it. LangGraph's `async` stays available per run."""
    graph, seen = graph_that_checks_its_saver()
    graph.invoke({"messages": [human("查", id="u")]}, thread("lag"), durability=durability)
    assert seen == [saved_first]


@pytest.mark.parametrize(("durability", "saved_first"), [(None, True), ("async", False)])
async def test_async_runs_save_each_step_before_the_next_too(durability, saved_first):
    graph, seen = graph_that_checks_its_saver()
    await graph.ainvoke({"messages": [human("查", id="u")]}, thread("lag"), durability=durability)
    assert seen == [saved_first]


def two_turns_with_a_shared_id(
    reply_id: str, first_id: str, second_id: str
) -> tuple[list, ScriptedChatModel]:
    """Two turns on one session, the first answered by a tool-calling reply under
    `reply_id`: the stored transcript and the model that saw every request."""
    batch = tool_calls(call("get_time", "call-1"))
    batch.id = reply_id
    model = ScriptedChatModel(script=[batch, AIMessage("八点半"), AIMessage("收到")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        graph.invoke({"messages": [HumanMessage("几点了", id=first_id)]}, thread("c"))
        graph.invoke({"messages": [HumanMessage("谢谢", id=second_id)]}, thread("c"))
        return graph.get_state(thread("c")).values["messages"], model


def test_a_reply_under_the_users_message_id_never_overwrites_what_the_user_said():
    """A provider (or a proxy in front of one) can answer under the id the platform gave
    the user's message; the reply is kept beside it, under a derived id, and the
    user's words still reach the model and the transcript."""
    messages, model = two_turns_with_a_shared_id("m1", first_id="m1", second_id="m3")
    assert [(m.type, m.id) for m in messages][:2] == [("human", "m1"), ("ai", "m1#ai")]
    assert messages[0].content == "几点了" and messages[2].tool_call_id == "call-1"
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert "几点了" in str(model.requests[-1].messages)


def test_an_inbound_id_that_a_reply_carries_never_overwrites_the_reply():
    """A platform message id can collide with a stored AI or tool message id; the human
    message is kept beside it and no tool call loses its result."""
    messages, model = two_turns_with_a_shared_id("shared-id", first_id="m1", second_id="shared-id")
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert messages[1].tool_calls and messages[2].tool_call_id == "call-1"
    assert messages[4].content == "谢谢" and messages[4].id == "shared-id#human"
    assert "tool:call-1" in " ".join(
        f"{m.type}:{getattr(m, 'tool_call_id', '')}" for m in model.requests[-1].messages
    )
