"""Graceful shutdown: a signal during a turn stops it at the next step boundary, resumably.

The public helper (`graph.shutdown`: `GracefulStop`, `run_turn`, `arun_turn`) in
this process and in a real worker process sent SIGTERM inside a tool call; the
CLI (`cyrene run`, `chat`, `resume`) in-process with real signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

import studio.demo.world
from graph import GracefulStop, StopRequested, arun_turn, build_graph, open_checkpointer, run_turn
from memory import MemoryItem, MemoryStore, Scope
from nodes.extraction.background import wait_for_extractions
from tests.cli_support import cyrene, one_line_error
from tests.conftest import REPO, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


def signal_main_thread(signum: int) -> None:
    """Send `signum` to this process's main thread, where Python runs signal handlers: sent
    to the process, the kernel may hand it to another thread (a background thread an earlier
    test left running), and the main thread's sleep is then not cut short."""
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signum)


def two_tools(stop: GracefulStop, ran: list[str], signum: int | None = None):
    """Two tools of one batch; `slow` asks to stop (by signal, or by `request`) while it runs."""

    @tool
    def quick(key: str) -> str:
        """Fast."""
        ran.append("quick")
        return f"value of {key}"

    @tool
    def slow(topic: str) -> str:
        """Asks the process to stop, then finishes its work."""
        ran.append("slow")
        if signum is None:
            stop.request()
        else:
            signal_main_thread(signum)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        return f"report on {topic}"

    return [quick, slow]


def final(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage("都查好了：" + "，".join(str(m.content) for m in messages if m.type == "tool"))


BATCH = tool_calls(call("quick", "call-1", key="k"), call("slow", "call-2", topic="t"))


def assert_stopped_after_the_tools(state) -> None:
    assert state.next == ("call_model",), "stopped at the boundary after the tool step"
    assert [m.type for m in state.values["messages"]] == ["human", "ai", "tool", "tool"]


@pytest.mark.parametrize("signum", [None, signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_a_tool_call_ends_the_turn_at_the_step_boundary(tmp_path, signum):
    ran: list[str] = []
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop, open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        model = ScriptedChatModel(script=[BATCH, final])
        graph = build_graph(make_config(model, tools=two_tools(stop, ran, signum)), saver)
        finished = run_turn(graph, {"messages": [HumanMessage("查一下")]}, thread("t"), stop=stop)
        assert finished is False
        assert_stopped_after_the_tools(graph.get_state(thread("t")))
        assert len(model.requests) == 1, "the next model call never started"
        assert stop.exit_code == {None: 143, signal.SIGTERM: 143, signal.SIGINT: 130}[signum]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous
    with GracefulStop() as again, open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        graph = build_graph(make_config(model, tools=two_tools(again, ran)), saver)
        assert run_turn(graph, None, thread("t"), stop=again) is True
        reply = graph.get_state(thread("t")).values["messages"][-1]
    assert reply.content == "都查好了：value of k，report on t"
    assert sorted(ran) == ["quick", "slow"], "no finished tool ran again"
    assert again.exit_code == 0


async def test_the_async_twin_stops_at_the_boundary_and_resumes(tmp_path):
    ran: list[str] = []
    stop = GracefulStop()  # `request()` only: no handlers needed
    model = ScriptedChatModel(script=[BATCH, final])
    async with open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        graph = build_graph(make_config(model, tools=two_tools(stop, ran)), saver)
        turn = {"messages": [HumanMessage("查一下")]}
        assert await arun_turn(graph, turn, thread("a"), stop=stop) is False
        assert_stopped_after_the_tools(await graph.aget_state(thread("a")))
        assert await arun_turn(graph, None, thread("a"), stop=GracefulStop()) is True
        assert await stop.adrain(timeout=5)
        assert (
            (await graph.aget_state(thread("a")))
            .values["messages"][-1]
            .content.startswith("都查好了")
        )
    assert sorted(ran) == ["quick", "slow"]


async def test_arun_turn_awaits_an_async_consumer_for_every_chunk():
    turn = {"messages": [HumanMessage("你好", id="h")]}
    seen: list[object] = []

    async def consume(chunk) -> None:
        await asyncio.sleep(0)
        seen.append(chunk)

    async with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(ScriptedChatModel(script=[AIMessage("好的")])), saver)
        assert await arun_turn(graph, turn, thread("c"), stop=GracefulStop(), on_chunk=consume)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(ScriptedChatModel(script=[AIMessage("好的")])), saver)
        sync_seen: list[object] = []
        assert run_turn(graph, turn, thread("c"), stop=GracefulStop(), on_chunk=sync_seen.append)
    assert seen and [list(c) for c in seen] == [list(c) for c in sync_seen], (
        "every update a plain callback gets, in the same order"
    )
    said = [m.content for c in seen for u in c.values() if u for m in u.get("messages", [])]
    assert "好的" in said


def test_a_second_signal_acts_as_if_no_handler_were_installed():
    with pytest.raises(KeyboardInterrupt), GracefulStop() as stop, stop.busy():
        signal_main_thread(signal.SIGINT)
        assert stop.requested and stop.exit_code == 130, "the first only asks"
        signal_main_thread(signal.SIGINT)
        time.sleep(1)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_idle_interactive_process_stops_at_once():
    with pytest.raises(StopRequested) as raised, GracefulStop(interrupt_idle=True):
        signal_main_thread(signal.SIGTERM)
        time.sleep(1)
    assert raised.value.exit_code == 143


class SlowExtractor:
    """A background extractor that takes its time (a model call, say)."""

    background = True

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def extract(self, messages: list[BaseMessage]) -> list[MemoryItem]:
        time.sleep(self.delay)
        return [MemoryItem(content=f"慢慢记住的事 {self.delay}", scope=Scope.USER)]


def test_the_drain_is_bounded_once_a_stop_is_requested(tmp_path):
    extractor = SlowExtractor(0.3)
    model = ScriptedChatModel(script=[AIMessage("好")] * 2)
    with (
        MemoryStore.open(tmp_path / "memory") as store,
        open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver,
    ):
        graph = build_graph(make_config(model, memory=store, extractor=extractor), saver)
        stop = GracefulStop()
        assert run_turn(graph, {"messages": [HumanMessage("记住这个")]}, thread("d"), stop=stop)
        assert stop.drain(timeout=10), "without a stop, the drain waits for the work"
        assert [item.content for item in store.list()] == ["慢慢记住的事 0.3"]
        extractor.delay = 1.0
        assert run_turn(graph, {"messages": [HumanMessage("还有这个")]}, thread("d"), stop=stop)
        stop.request()
        started = time.monotonic()
        assert stop.drain(timeout=60, grace=0.2) is False, "the late work stays pending"
        assert time.monotonic() - started < 0.9
        assert wait_for_extractions(10)


def test_sigterm_in_a_worker_process_during_a_tool_call_leaves_a_resumable_session(tmp_path):
    db, log = tmp_path / "c.db", tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def worker(mode: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "tests.shutdown_worker", str(db), str(log), mode]
        return subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)

    started = worker("start")
    deadline = time.monotonic() + 60
    while "slow start" not in (log.read_text() if log.exists() else ""):
        assert started.poll() is None and time.monotonic() < deadline, started.stderr.read()
        time.sleep(0.02)
    started.send_signal(signal.SIGTERM)
    assert started.wait(30) == 143, started.stderr.read()
    assert _lines(log)[-2:] == [
        "slow done, stop requested: True",
        "finished=False next=call_model exit=143",
    ]
    resumed = worker("resume")
    assert resumed.wait(60) == 0, resumed.stderr.read()
    lines = _lines(log)
    assert lines.count("slow start") == 1 and lines.count("quick k") == 1, "no tool ran twice"
    assert "finished=True next= exit=0" in lines
    assert "sent human: | ai: | tool:call-1 | tool:call-2" in lines, "no unanswered tool call"
    assert lines[-1] == "reply 都查好了：value of k，report on t"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_cyrene_run_stopped_by_sigterm_says_how_to_resume(tmp_path, capsys):
    def ask_for_time_then_get_terminated(messages: list[BaseMessage]) -> AIMessage:
        signal_main_thread(signal.SIGTERM)
        return tool_calls(call("get_time", "call-t"))

    model = ScriptedChatModel(script=[ask_for_time_then_get_terminated, final])
    data = ("--data", str(tmp_path))
    stopped = cyrene(capsys, "run", "现在几点了", "--session", "s1", *data, model=model)
    assert stopped.code == 143
    assert "`cyrene resume s1` finishes it" in one_line_error(stopped)
    history = cyrene(capsys, "history", "s1", *data).out.splitlines()
    assert [line.split()[0] for line in history] == ["human", "ai(xilian)"], "the tool never ran"
    resumed = cyrene(capsys, "resume", "s1", *data, model=model)
    assert resumed.code == 0, resumed.err
    assert resumed.out.startswith("都查好了：")
    history = cyrene(capsys, "history", "s1", *data).out.splitlines()
    assert [line.split()[0] for line in history] == [
        "human",
        "ai(xilian)",
        "tool(get_time)",
        "ai(xilian)",
    ]


class InterruptedStdin:
    """A terminal whose user presses Ctrl-C while the chat waits for a line."""

    def __init__(self) -> None:
        self.lines = ["你好\n"]

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        if self.lines:
            return self.lines.pop()
        signal_main_thread(signal.SIGINT)
        time.sleep(1)
        return "/quit\n"


def test_cyrene_chat_waiting_for_input_stops_on_sigint(tmp_path, capsys):
    out = cyrene(
        capsys, "chat", "--session", "c", "--data", str(tmp_path), stdin=InterruptedStdin()
    )
    assert out.code == 130
    assert "昔涟：收到「你好」" in out.out and "Traceback" not in out.err


def test_a_signal_in_the_last_step_lets_the_turn_end_and_then_stops(tmp_path, capsys, monkeypatch):
    def terminated_while_the_mood_is_read(user: str, assistant: str, persona: str | None) -> str:
        signal_main_thread(signal.SIGTERM)
        return "平静"

    monkeypatch.setattr(studio.demo.world, "demo_mood", terminated_while_the_mood_is_read)
    data = ("--data", str(tmp_path))
    out = cyrene(capsys, "chat", "--session", "c", *data, stdin="你好\n还在吗\n")
    assert out.code == 143, out.err
    assert "收到「你好」" in out.out and "还在吗" not in out.out, "the chat ended after the turn"
    assert cyrene(capsys, "resume", "c", *data).code == 1, "nothing to resume: the turn is whole"
