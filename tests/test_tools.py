"""Tool dispatch: parallel and sequential execution, the cap, and per-batch/per-call hooks."""

from __future__ import annotations

import threading
import time

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from graph import ToolCalls, ToolHooks, build_graph
from tests.conftest import human, make_config, owner, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


class Tracker:
    """Records start order and peak concurrency of a slow tool."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.order: list[int] = []

        @tool
        def slow(i: int) -> str:
            """Takes 200 ms."""
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
                self.order.append(i)
            time.sleep(0.2)
            with self.lock:
                self.active -= 1
            return f"done {i}"

        self.tool = slow


def run_batch(n: int, **overrides) -> tuple[float, Tracker, list]:
    tracker = Tracker()
    batch = tool_calls(*(call("slow", f"c{i}", i=i) for i in range(n)))
    model = ScriptedChatModel(script=[batch, AIMessage("完成")])
    graph = build_graph(make_config(model, tools=[tracker.tool], **overrides))
    started = time.perf_counter()
    out = graph.invoke({"messages": [human("go")]}, thread("t"))
    return time.perf_counter() - started, tracker, out["messages"]


def test_parallel_calls_overlap():
    elapsed, tracker, messages = run_batch(4)
    assert tracker.peak == 4
    assert elapsed < 0.6, f"four 200 ms tools took {elapsed:.2f}s in parallel"
    assert [m.content for m in messages if isinstance(m, ToolMessage)] == [
        f"done {i}" for i in range(4)
    ]


def test_parallelism_is_capped():
    elapsed, tracker, _ = run_batch(6, features=[ToolCalls(parallelism=2)])
    assert tracker.peak == 2
    assert elapsed > 0.55, "six 200 ms calls two at a time need at least three waves"


def test_sequential_calls_run_one_by_one_in_order():
    elapsed, tracker, messages = run_batch(3, features=[ToolCalls(execution="sequential")])
    assert tracker.peak == 1
    assert tracker.order == [0, 1, 2]
    assert elapsed > 0.55
    assert [m.tool_call_id for m in messages if isinstance(m, ToolMessage)] == ["c0", "c1", "c2"]


async def test_parallel_calls_overlap_on_the_async_path():
    tracker = Tracker()
    model = ScriptedChatModel(
        script=[tool_calls(*(call("slow", f"c{i}", i=i) for i in range(4))), AIMessage("ok")]
    )
    graph = build_graph(make_config(model, tools=[tracker.tool]))
    started = time.perf_counter()
    await graph.ainvoke({"messages": [human("go")]}, thread("a"))
    assert tracker.peak == 4 and time.perf_counter() - started < 0.6


def test_hooks_see_batches_and_calls_and_may_veto():
    events = []
    hooks = ToolHooks(
        before_batch=lambda calls, env: events.append(
            ("before_batch", [c["id"] for c in calls], env.actor)
        ),
        after_batch=lambda calls, results, env: events.append(
            ("after_batch", [c["id"] for c in calls], [r.status for r in results])
        ),
        before_call=lambda c, env: "needs approval" if c["name"] == "explode" else None,
        after_call=lambda c, result, env: events.append(("after_call", c["id"], result.content)),
    )
    batch = tool_calls(call("add", "c1", a=1, b=2), call("explode", "c2", reason="x"))
    model = ScriptedChatModel(script=[batch, AIMessage("ok")])
    out = build_graph(
        make_config(model, features=[ToolCalls(hooks=hooks, execution="sequential")])
    ).invoke({"messages": [human("go")]}, thread("h"), context=owner())
    vetoed = next(
        m for m in out["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "c2"
    )
    assert vetoed.status == "error" and vetoed.content == "vetoed: needs approval"
    assert events == [
        ("before_batch", ["c1", "c2"], "owner"),
        ("after_call", "c1", "3"),
        ("after_batch", ["c1", "c2"], ["success", "error"]),
    ]


@pytest.mark.parametrize("hook", ["before_batch", "after_batch", "before_call", "after_call"])
def test_a_failing_hook_is_logged_and_the_turn_goes_on(hook, caplog):
    def broken(*_):
        raise RuntimeError("hook down")

    model = ScriptedChatModel(script=[tool_calls(call("add", "c1", a=1, b=2)), AIMessage("3")])
    out = build_graph(
        make_config(model, features=[ToolCalls(hooks=ToolHooks(**{hook: broken}))])
    ).invoke({"messages": [human("1+2")]}, thread("f"))
    assert [m.content for m in out["messages"]][-2:] == ["3", "3"]
    assert f"hook {hook} failed" in caplog.text
