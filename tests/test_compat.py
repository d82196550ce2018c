"""What `nodes/kernel/compat/` relies on upstream still holds — and says what moved when not.

Each test names the upstream change that would break the loop, so an upgrade
that moves one of these fails here with a sentence, not deep inside a turn.
"""

from __future__ import annotations

import inspect
import operator
from importlib.metadata import version
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from nodes.kernel import compat
from tests.scripted import ScriptedChatModel


def test_langgraph_is_a_minor_the_tests_cover():
    major_minor = tuple(int(p) for p in version("langgraph").split(".")[:2])
    assert major_minor == (1, 2), (
        f"langgraph {version('langgraph')} is outside the pinned 1.2.x: DeltaChannel is Beta and "
        "nodes/kernel/compat/ uses private names; re-run this file, then widen the pin in pyproject.toml"
    )


def test_durability_config_key_is_what_pregel_reads():
    from langgraph.pregel import main as pregel_main

    assert compat.CONFIG_KEY_DURABILITY == "__pregel_durability", (
        "langgraph renamed the config key a parent graph uses to pass durability down; "
        "graph/runs/compiled.py would then override a parent's choice"
    )
    assert "CONFIG_KEY_DURABILITY" in inspect.getsource(pregel_main), (
        "Pregel no longer reads CONFIG_KEY_DURABILITY from the config"
    )


def test_runnable_callable_takes_sync_and_async_twins():
    def sync(state: dict) -> dict:
        return {"messages": [AIMessage("sync")]}

    async def async_(state: dict) -> dict:
        return {"messages": [AIMessage("async")]}

    node = compat.RunnableCallable(sync, async_, name="twin", trace=False)
    assert node.invoke({})["messages"][0].content == "sync", (
        "RunnableCallable(func, afunc) no longer runs `func` on invoke"
    )


async def test_runnable_callable_runs_the_async_twin_on_ainvoke():
    def sync(state: dict) -> dict:
        return {"messages": [AIMessage("sync")]}

    async def async_(state: dict) -> dict:
        return {"messages": [AIMessage("async")]}

    node = compat.RunnableCallable(sync, async_, name="twin", trace=False)
    assert (await node.ainvoke({}))["messages"][0].content == "async", (
        "RunnableCallable(func, afunc) no longer runs `afunc` on ainvoke"
    )


async def test_a_sync_node_runs_on_a_worker_thread_in_an_async_run():
    import threading

    def sync(state: dict) -> dict:
        return {"thread": threading.get_ident()}

    node = compat.sync_node(sync, "sync_only")
    assert node.name == "sync_only"
    assert (await node.ainvoke({}))["thread"] != threading.get_ident(), (
        "coerce_to_runnable no longer runs a sync function off the event loop"
    )


class _State(TypedDict):
    messages: Annotated[list, add_messages]


def _compiled():
    graph = StateGraph(_State)
    graph.add_node("echo", lambda s: {"messages": [AIMessage("hi")]})
    graph.add_edge(START, "echo")
    return graph.compile(checkpointer=InMemorySaver())


def test_a_compiled_graph_can_be_reclassed_from_its_attributes():
    from langgraph.graph.state import CompiledStateGraph

    class Marked(CompiledStateGraph):
        def __init__(self, *, mark: str, **kwargs):
            super().__init__(**kwargs)
            self.mark = mark

    try:
        marked = compat.reclass_compiled(_compiled(), Marked, mark="m")
    except TypeError as exc:
        pytest.fail(f"CompiledStateGraph.__init__ no longer takes its own attributes: {exc}")
    out = marked.invoke({"messages": [HumanMessage("x")]}, {"configurable": {"thread_id": "t"}})
    assert marked.mark == "m" and out["messages"][-1].content == "hi"


def _fold(current: list, writes: list) -> list:
    for write in writes:
        current = add_messages(current, write)
    return current


class _DeltaState(TypedDict):
    messages: Annotated[list, compat.DeltaChannel(_fold)]


def test_delta_channel_keeps_a_transcript_across_checkpoints():
    from langgraph.graph import END

    graph = StateGraph(_DeltaState)
    graph.add_node("echo", lambda s: {"messages": [AIMessage(f"#{len(s['messages'])}")]})
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for text in ("a", "b"):
        app.invoke({"messages": [HumanMessage(text)]}, config)
    texts = [m.content for m in app.get_state(config).values["messages"]]
    assert texts == ["a", "#1", "b", "#3"], (
        "DeltaChannel (Beta) no longer rebuilds the full list from its deltas"
    )


def test_chat_model_provider_reads_langchains_tracing_params():
    assert compat.chat_model_provider(ScriptedChatModel(provider="anthropic")) == "anthropic"

    from langchain_openai import ChatOpenAI

    assert compat.chat_model_provider(ChatOpenAI(model="gpt-4o-mini", api_key="offline")) == (
        "openai"
    ), "BaseChatModel._get_ls_params no longer reports ls_provider"


def test_a_delta_channel_value_can_be_rebuilt_and_stored_as_a_snapshot():
    """`graph/retention.py` snapshots the transcript before it deletes ancestors."""
    graph = StateGraph(_DeltaState)
    graph.add_node("echo", lambda s: {"messages": [AIMessage(f"#{len(s['messages'])}")]})
    graph.add_edge(START, "echo")
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for text in ("a", "b"):
        app.invoke({"messages": [HumanMessage(text)]}, config)
    saved = app.checkpointer.get_tuple(config)
    assert compat.delta_channels_replayed(saved) == {"messages"}, (
        "checkpoint metadata no longer names DeltaChannels in counters_since_delta_snapshot (Beta)"
    )
    specs = {k: v for k, v in app.channels.items() if isinstance(v, compat.DeltaChannel)}
    [snapshot] = compat.delta_snapshots(app.checkpointer, saved.config, specs).values()
    assert isinstance(snapshot, compat.DeltaSnapshot), "_DeltaSnapshot moved or was renamed"
    assert [m.content for m in snapshot.value] == ["a", "#1", "b", "#3"], (
        "get_delta_channel_history + DeltaChannel.replay_writes (Beta) no longer rebuild the value"
    )


def test_retry_policy_retries_reads_retry_on_as_langgraph_does():
    from langgraph.types import RetryPolicy

    from nodes.kernel.compat import retry_policy_retries

    assert retry_policy_retries(RetryPolicy(retry_on=ValueError), ValueError("x"))
    assert not retry_policy_retries(RetryPolicy(retry_on=(KeyError,)), ValueError("x"))
    assert retry_policy_retries(RetryPolicy(retry_on=lambda e: "x" in str(e)), ValueError("x"))


def test_a_subgraph_call_carries_a_task_id_and_its_nodes_see_their_graphs_namespace():
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    from nodes.kernel.compat import graph_namespace, inside_parent_run

    class S(TypedDict):
        x: int

    seen = []

    def record(state: S, config: RunnableConfig) -> dict:
        seen.append((inside_parent_run(config), graph_namespace(config)))
        return {"x": state["x"] + 1}

    inner = StateGraph(S)
    inner.add_node("n", record)
    inner.add_edge(START, "n")
    child = inner.compile()
    outer = StateGraph(S)
    outer.add_node("sub", child)
    outer.add_edge(START, "sub")
    outer.compile().invoke({"x": 1})
    [(inside, namespace)] = seen
    assert inside and namespace.startswith("sub:"), "a subgraph's node sees its graph's namespace"
    child.invoke({"x": 1})
    assert seen[-1] == (True, ""), "a root graph's node sees the root namespace"
    assert not inside_parent_run({"configurable": {"thread_id": "t", "checkpoint_ns": "x"}})


def test_the_transcript_reducer_spells_remove_all_as_langgraph_does():
    from langgraph.graph.message import REMOVE_ALL_MESSAGES

    from nodes.core.reducers import REMOVE_ALL_MESSAGES as ours

    assert ours == REMOVE_ALL_MESSAGES, (
        "LangGraph renamed the id that removes every message; nodes/core/reducers.py keeps a copy "
        "so that reading a transcript need not load LangGraph's graph package"
    )


def test_a_checkpoint_says_which_node_runs_next_through_its_branch_channel():
    """`waits_at` reads `branch:to:<node>` versions against `versions_seen` (Pregel's
    trigger rule); a rename of that channel or a change to the rule would break it."""

    class State(TypedDict):
        steps: Annotated[list[str], lambda a, b: a + b]

    graph = StateGraph(State)
    graph.add_node("first", lambda state: {"steps": ["first"]})
    graph.add_node("second", lambda state: {"steps": ["second"]})
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    saver = InMemorySaver()
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"steps": []}, config, interrupt_after=["first"])
    saved = saver.get_tuple(config)
    assert app.get_state(config).next == ("second",)
    assert compat.waits_at(saved, "second") and not compat.waits_at(saved, "first")
    app.invoke(None, config)
    done = saver.get_tuple(config)
    assert not compat.waits_at(done, "second") and not compat.waits_at(done, "first")


class _RouteState(TypedDict):
    steps: Annotated[list[str], operator.add]
    other: Annotated[list[str], operator.add]


class _StepsOnly(TypedDict):
    steps: list[str]


def test_a_route_reads_only_its_channels_with_its_steps_writes_folded_in():
    """`narrow_route_reads` gives Pregel's `local_read` (the `partial` under CONFIG_KEY_READ)
    only a route's channels, and a `reads_nothing` route no reader: it gets its node's output,
    as LangGraph's `BranchSpec._route` passes it without a reader."""
    from langgraph.pregel._algo import local_read

    seen: dict[str, object] = {}

    def first(state: _RouteState, config: RunnableConfig) -> dict:
        read = config["configurable"][compat.CONFIG_KEY_READ]
        seen["reader"] = (getattr(read, "func", None), len(getattr(read, "args", ())))
        return {"steps": ["first"]}

    def by_steps(state: _StepsOnly) -> str:
        seen["read"] = dict(state)
        return "second"

    def fixed(output: object) -> str:
        seen["output"] = output
        return "third"

    graph = StateGraph(_RouteState)
    graph.add_node("first", first)
    graph.add_node("second", lambda state: {"steps": ["second"]})
    graph.add_node("third", lambda state: {"other": ["third"]})
    graph.add_edge(START, "first")
    graph.add_conditional_edges("first", by_steps, ["second"])
    graph.add_conditional_edges("second", compat.reads_nothing(compat.RunnableCallable(fixed)))
    app = graph.compile()
    compat.narrow_route_reads(app)
    out = app.invoke({"steps": ["in"], "other": ["o"]})
    assert seen["reader"] == (local_read, 4), (
        "Pregel no longer puts partial(local_read, scratchpad, channels, managed, task) under "
        "CONFIG_KEY_READ: narrow_route_reads falls back to LangGraph's whole fresh read"
    )
    assert seen["read"] == {"steps": ["in", "first"]}, "a route no longer sees its step's writes"
    assert seen["output"] == {"steps": ["second"]}, (
        "a route without a reader no longer gets its node's output"
    )
    assert out == {"steps": ["in", "first", "second"], "other": ["o", "third"]}


def test_the_loops_routes_copy_no_state_but_the_model_routes_transcript():
    """`build_graph` narrows its routes: those fixed at build time read nothing (START's is
    a plain edge's write, `write_fixed_start`), and only the route after the model reads
    state (its own transcript read, not LangGraph's whole one)."""
    from langgraph.pregel._write import ChannelWrite

    from graph import LoopConfig, build_graph

    graph = build_graph(LoopConfig(model=ScriptedChatModel()))
    readers = {
        start: writer.kwargs["reader"]
        for start, node in graph.nodes.items()
        for writer in node.writers
        if "reader" in (getattr(writer, "kwargs", None) or {})
    }
    assert set(readers) == {
        "resolve_vision",
        "compact",
        "call_model",
        "dispatch_tools",
        "extract_memory",
    }, "LangGraph no longer keeps a route's reader in its writer's kwargs"
    assert getattr(readers.pop("call_model"), "__qualname__", "").startswith("_fresh_read")
    assert set(readers.values()) == {None}
    start = graph.nodes["__start__"].node
    assert isinstance(start, ChannelWrite), "__start__ runs a sequence: a task of its own a turn"
    drawn = {(e.source, e.target, e.conditional) for e in graph.get_graph().edges}
    assert {(START, node, True) for node in ("resolve_vision", "compact", "call_model")} <= drawn
