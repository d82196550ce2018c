"""The memories as a read-only LangGraph `BaseStore` (issue 31, "visible where LangGraph
users look"): namespaces per bucket, ranked search within them, restricted views that
never show a persona's memories, writes refused, and `runtime.store` in a node."""

from __future__ import annotations

from typing import Any, TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime

from graph import MemoryStoreView, SessionEnv, build_graph
from memory import MemoryItem, MemoryStore, MemoryStoreError, Scope
from tests.conftest import human, make_config, owner, thread
from tests.scripted import ScriptedChatModel, call, tool_calls
from tests.test_readme import page, python_block

PRIVATE = "主人偷偷告诉昔涟：他怕黑"
OTHER = "主人告诉阿格莱雅：他想学小提琴"
HABIT = "主人每天早上喝一杯美式咖啡"
PUBLIC = "这个项目的代号是 nightingale"


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    with MemoryStore.open(tmp_path / "memory") as opened:
        opened.add_many(
            [
                MemoryItem(content=PRIVATE, scope=Scope.PERSONA, persona_id="xilian"),
                MemoryItem(content=OTHER, scope=Scope.PERSONA, persona_id="aglaea"),
                MemoryItem(content=HABIT, scope=Scope.USER),
                MemoryItem(content=PUBLIC, scope=Scope.PROJECT),
            ]
        )
        yield opened


def contents(items: list[Any]) -> list[str]:
    return sorted(i.value["content"] for i in items)


def test_one_namespace_per_scope_and_persona(store):
    view = MemoryStoreView(store)
    assert view.list_namespaces(prefix=("memories",)) == [
        ("memories", "user"),
        ("memories", "project"),
        ("memories", "persona", "aglaea"),
        ("memories", "persona", "xilian"),
    ]
    assert view.list_namespaces(prefix=("memories", "persona"), max_depth=2) == [
        ("memories", "persona")
    ]
    assert view.list_namespaces(suffix=("xilian",)) == [("memories", "persona", "xilian")]
    assert contents(view.search(("memories", "persona", "xilian"))) == [PRIVATE]
    assert contents(view.search(("memories", "user"))) == [HABIT]
    assert contents(view.search(("memories",), filter={"scope": "project"})) == [PUBLIC]
    [habit] = view.search(("memories", "user"))
    got = view.get(("memories", "user"), habit.key)
    assert got is not None and got.value["content"] == HABIT and got.value["kind"] == "fact"
    assert view.get(("memories", "project"), habit.key) is None, "only in its own namespace"


def test_a_query_is_the_store_s_own_ranked_search_within_the_namespaces(store):
    view = MemoryStoreView(store, persona_id="xilian")
    hits = view.search(("memories",), query="主人早上喝什么咖啡", limit=2)
    assert hits[0].value["content"] == HABIT and hits[0].score is not None
    [mine] = view.search(("memories", "persona", "xilian"), query="主人怕什么", limit=5)
    assert mine.value["content"] == PRIVATE
    everyone = MemoryStoreView(store).search(("memories", "persona"), query="小提琴", limit=1)
    assert [h.value["content"] for h in everyone] == [OTHER]


def test_a_persona_or_restricted_view_never_shows_what_it_may_not_read(store):
    xilian = MemoryStoreView(store, persona_id="xilian")
    assert OTHER not in contents(xilian.search(("memories",), limit=50))
    assert xilian.list_namespaces(prefix=("memories", "persona")) == [
        ("memories", "persona", "xilian")
    ]
    restricted = MemoryStoreView(store, persona_id="xilian", restricted=True)
    assert contents(restricted.search(("memories",), limit=50)) == sorted([HABIT, PUBLIC])
    for query in (PRIVATE, OTHER, "怕黑", "小提琴"):
        found = contents(restricted.search(("memories",), query=query, limit=50))
        assert PRIVATE not in found and OTHER not in found
    [private] = MemoryStoreView(store).search(("memories", "persona", "xilian"))
    assert restricted.get(private.namespace, private.key) is None
    assert restricted.list_namespaces() == [("memories", "user"), ("memories", "project")]


def test_writes_are_refused_and_name_the_store_s_own_api(store):
    view = MemoryStoreView(store)
    with pytest.raises(MemoryStoreError, match=r"read-only.*MemoryStore"):
        view.put(("memories", "user"), "k", {"content": "x"})
    [habit] = view.search(("memories", "user"))
    with pytest.raises(MemoryStoreError, match="read-only"):
        view.delete(("memories", "user"), habit.key)
    assert HABIT in [i.content for i in store.list()]


def test_the_loop_s_graph_and_a_user_s_own_node_read_it_through_runtime_store(store):
    view = MemoryStoreView(store)
    seen: list[str] = []

    @tool
    def recall_coffee(runtime: ToolRuntime) -> str:
        """What the owner drinks in the morning."""
        seen.extend(h.value["content"] for h in runtime.store.search(("memories",), query="咖啡"))
        return "ok"

    model = ScriptedChatModel(script=[tool_calls(call("recall_coffee", "c1")), AIMessage("好")])
    config = make_config(model, memory=store, tools=[recall_coffee])
    graph = build_graph(config, store=view)
    graph.invoke({"messages": [human("早")]}, thread("view"), context=owner("xilian"))
    assert seen and seen[0] == HABIT, "the loop's own tool reads it as runtime.store"

    class State(TypedDict):
        found: list[str]

    def recall(state: State, runtime: Runtime) -> dict:
        assert runtime.store is not None
        hits = runtime.store.search(("memories",), query="咖啡", limit=1)
        return {"found": [h.value["content"] for h in hits]}

    own = StateGraph(State)
    own.add_node("recall", recall)
    own.add_edge(START, "recall")
    own.add_edge("recall", END)
    app = own.compile(store=view)
    assert app.invoke({"found": []}) == {"found": [HABIT]}


def test_the_docs_snippet_runs():
    """docs/memory.md "The memories in LangGraph's store", saved alone and run."""
    code = python_block(page("memory.md"), "## The memories in LangGraph's store")
    exec(compile(code, "docs/memory.md", "exec"), {"__name__": "snippet"})


@pytest.mark.slow
@pytest.mark.services
async def test_studio_s_store_view_shows_the_demo_s_memories_read_only(tmp_path):
    """`langgraph dev` from the repo root loads the view `langgraph.json` names."""
    from langgraph_sdk import get_client

    from studio.demo.world import SEED_MEMORIES
    from tests.test_studio import DevServer

    server = DevServer(tmp_path / "data", tmp_path / "dev.log")
    try:
        server.wait()
        client = get_client(url=server.url)
        spaces = await client.store.list_namespaces(prefix=["memories"])
        assert spaces["namespaces"] and all(ns[0] == "memories" for ns in spaces["namespaces"])
        listed = await client.store.search_items(["memories"], limit=100)
        seeded = {m.content for m in SEED_MEMORIES}
        assert {i["value"]["content"] for i in listed["items"]} <= seeded
        assert listed["items"], "the demo's memories are shown"
        with pytest.raises(httpx.HTTPStatusError):
            await client.store.put_item(["memories", "user"], "k", {"content": "x"})
    finally:
        server.stop()
    assert "read-only" in server.log.read_text(), "the server logs why"


@pytest.mark.parametrize("built_for", [{}, {"persona_id": "xilian"}])
@pytest.mark.parametrize("actor", ["group", "stranger", "owner"])
def test_inside_a_turn_the_view_reads_no_more_than_that_session_may(store, actor, built_for):
    """A tool a group member can steer (it is in `restricted_tools`) reads `runtime.store`:
    in a group's or a stranger's turn it finds shared memories only, and in an owner's turn
    with a persona, that persona's and the shared ones, however the view was built."""
    view = MemoryStoreView(store, **built_for)
    seen: list[str] = []

    @tool
    def lookup(runtime: ToolRuntime) -> str:
        """Look the owner up."""
        for namespace in runtime.store.list_namespaces(prefix=("memories",)):
            seen.extend(i.value["content"] for i in runtime.store.search(namespace, limit=50))
        seen.extend(h.value["content"] for h in runtime.store.search(("memories",), query="主人"))
        private = store.list(scope=Scope.PERSONA, persona_id="xilian")[0]
        if (
            got := runtime.store.get(("memories", "persona", "xilian"), str(private.id))
        ) is not None:
            seen.append(got.value["content"])
        return "ok"

    model = ScriptedChatModel(script=[tool_calls(call("lookup", "c1")), AIMessage("好")])
    config = make_config(model, memory=store, tools=[lookup], restricted_tools={"lookup"})
    graph = build_graph(config, store=view)
    context = owner("aglaea") if actor == "owner" else SessionEnv(actor=actor)
    graph.invoke({"messages": [human("查一下")]}, thread(f"{actor}-view"), context=context)
    assert seen, "the tool ran and read the view"
    assert PRIVATE not in seen, "xilian's memory reached another session's tool"
    assert (OTHER in seen) == (actor == "owner" and not built_for), seen
    assert HABIT in seen
    outside = view.search(("memories", "persona", "xilian"))
    assert contents(outside) == [PRIVATE], "outside a turn the view reads as it was built"
