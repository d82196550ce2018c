"""The incremental savers load exactly what LangGraph's own walk loads, and read by key."""

from __future__ import annotations

from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from nodes.kernel.compat import DeltaChannel
from nodes.kernel.compat.savers import (
    IncrementalMemorySaver,
    IncrementalSqliteSaver,
    incremental_postgres_saver,
)


def _fold(current: list, writes: list) -> list:
    for write in writes:
        current = add_messages(current, write)
    return current


class _DeltaState(TypedDict):
    messages: Annotated[list, DeltaChannel(_fold)]


def _echo_app(saver):
    graph = StateGraph(_DeltaState)
    graph.add_node("echo", lambda s: {"messages": [AIMessage(f"#{len(s['messages'])}")]})
    graph.add_edge(START, "echo")
    return graph.compile(checkpointer=saver)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def incremental_saver(request, tmp_path):
    """Each incremental saver, with the class whose own walk it shortcuts."""
    if request.param == "memory":
        yield IncrementalMemorySaver(), InMemorySaver
        return
    if request.param == "postgres":
        from langgraph.checkpoint.postgres import PostgresSaver

        url = request.getfixturevalue("fresh_postgres_url")
        with incremental_postgres_saver().from_conn_string(url) as saver:
            saver.setup()
            yield saver, PostgresSaver
        return
    with IncrementalSqliteSaver.from_conn_string(str(tmp_path / "c.db")) as saver:
        yield saver, SqliteSaver


def test_the_incremental_savers_load_what_langgraphs_walk_loads(monkeypatch, incremental_saver):
    """Their shortcut (walk back only to the thread's last load) returns LangGraph's own
    history at every checkpoint: past a snapshot, for older checkpoints, after a fork,
    and for a thread deleted and started again."""
    saver, base = incremental_saver
    full_walk = base.get_delta_channel_history
    full_walks = []

    def counted(self, **kwargs):
        full_walks.append(kwargs["config"])
        return full_walk(self, **kwargs)

    monkeypatch.setattr(base, "get_delta_channel_history", counted)
    app = _echo_app(saver)
    config = {"configurable": {"thread_id": "t"}}

    def both(at: dict) -> tuple:
        ours = saver.get_delta_channel_history(config=at, channels=["messages"])
        theirs = full_walk(saver, config=at, channels=["messages"])
        return ours, theirs

    for turn in range(70):  # two updates a turn: the 100-update snapshot is crossed
        app.invoke({"messages": [HumanMessage(f"m{turn}", id=f"h{turn}")]}, config)
        ours, theirs = both(config)
        assert ours == theirs, f"turn {turn}: the incremental history differs from LangGraph's"
    assert "seed" in both(config)[1]["messages"], "the session crossed a snapshot"
    snapshots_restart = 0 if base is InMemorySaver else 1  # a database's walk starts at one
    assert len(full_walks) == 1 + snapshots_restart, (
        "after the first load, each turn's load walked only its own steps"
    )
    older = [s.config for s in app.get_state_history(config)]
    for at in older[::7]:
        ours, theirs = both(at)
        assert ours == theirs
    fork = app.update_state(older[40], {"messages": [HumanMessage("fork", id="fork")]})
    ours, theirs = both(fork)
    assert ours == theirs
    assert app.get_state(fork).values["messages"][-1].content == "fork"
    saver.delete_thread("t")
    app.invoke({"messages": [HumanMessage("again", id="again")]}, config)
    assert [m.content for m in app.get_state(config).values["messages"]] == ["again", "#1"]


def test_the_postgres_saver_reads_a_checkpoint_by_key_and_as_langgraph_does(fresh_postgres_url):
    """Reading the newest checkpoint looks each channel's blob up by its key instead of
    joining the thread's every blob (one a turn), so it does not slow as the session
    grows, and it returns what `PostgresSaver` returns."""
    from langgraph.checkpoint.postgres import PostgresSaver

    with incremental_postgres_saver().from_conn_string(fresh_postgres_url) as saver:
        saver.setup()
        app = _echo_app(saver)
        config = {"configurable": {"thread_id": "t"}}
        for turn in range(30):
            app.invoke({"messages": [HumanMessage(f"m{turn}", id=f"h{turn}")]}, config)
        with PostgresSaver.from_conn_string(fresh_postgres_url) as theirs:
            assert saver.get_tuple(config) == theirs.get_tuple(config)
            assert list(saver.list(config, limit=5)) == list(theirs.list(config, limit=5))
        with saver._cursor() as cur:
            cur.execute(
                "EXPLAIN " + saver.SELECT_SQL + " WHERE thread_id = %s AND checkpoint_ns = %s "
                "ORDER BY checkpoint_id DESC LIMIT 1",
                ("t", ""),
            )
            plan = "\n".join(row["QUERY PLAN"] for row in cur.fetchall())
    blobs = [line for line in plan.splitlines() if "checkpoint_blobs" in line]
    assert blobs and all("Index Scan" in line for line in blobs), plan
    assert "(channel = version.key) AND (version = version.value)" in plan, (
        "each blob is found by its whole key, not by filtering the thread's blobs\n" + plan
    )


async def test_open_checkpointer_plans_each_postgres_query_for_its_values(fresh_postgres_url):
    """A generic plan cached while the session was young would read it as a scan later (the
    tables only grow, and with autovacuum off nothing replans it): both savers plan per query."""
    from graph import open_checkpointer

    with open_checkpointer(fresh_postgres_url) as saver:
        mode = saver.conn.execute("SHOW plan_cache_mode").fetchone()
        assert mode["plan_cache_mode"] == "force_custom_plan"
    async with open_checkpointer(fresh_postgres_url) as saver:
        mode = await (await saver.conn.execute("SHOW plan_cache_mode")).fetchone()
        assert mode["plan_cache_mode"] == "force_custom_plan"
        assert saver.SELECT_SQL == incremental_postgres_saver().SELECT_SQL, (
            "the async saver reads blobs by key too"
        )
