"""The background extraction pipeline in one process: recorded, pruned, bounded, keeping up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from graph import (
    build_graph,
    extraction_stats,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import HashingEmbedding, MemoryItem, MemoryStore, Scope, Source
from nodes.extraction import pipeline
from nodes.extraction.background import ExtractionJob, queue_depth, unfinished
from nodes.extraction.ledger import (
    LEDGER_COLLECTION,
    ExtractionLedger,
    ProvidesExtractionLedger,
    Record,
    SqliteExtractionLedger,
    claimable,
    this_owner,
)
from nodes.extraction.pipeline import Pipeline
from nodes.kernel.messages import last_human, message_text
from tests.conftest import chroma_run, free_port, human, make_config, thread
from tests.scripted import ScriptedChatModel


class Remember:
    """Background: the turn's own words become one memory; may wait for a gate first."""

    background = True

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        text = message_text(last_human(messages))
        with self.lock:
            self.calls.append(text)
        if self.gate is not None:
            self.gate.wait(30)
        return [MemoryItem(content=text, kind="said", scope=Scope.USER)]


class Endless(ScriptedChatModel):
    """Answers "嗯" after 20 ms, as often as asked (a long script would be re-serialised
    by LangChain on every call)."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        time.sleep(0.02)
        return ChatResult(generations=[ChatGeneration(message=AIMessage("嗯"))])


@pytest.fixture
def store(tmp_path) -> Iterator[MemoryStore]:
    with MemoryStore.open(tmp_path / "mem") as opened:
        yield opened
        wait_for_extractions(30)


def contents(store: MemoryStore) -> list[str]:
    return sorted(i.content for i in store.list())


def test_each_turn_records_its_extraction_and_settled_ones_are_dropped(tmp_path, store):
    gate = threading.Event()
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")] * 2), memory=store, extractor=Remember(gate)
    )
    with open_checkpointer(f"sqlite:///{tmp_path}/c.db") as saver:
        graph = build_graph(config, saver)
        graph.invoke({"messages": [human("第一件事", id="u1")]}, thread("t"))
        state = graph.get_state(thread("t")).values
        [entry] = state["pending_extractions"]
        assert entry["boundary"] == state["messages"][-1].id
        assert (entry["session_id"], entry["message_id"], entry["persona_id"]) == (
            "t",
            "u1",
            "xilian",
        )
        gate.set()
        assert wait_for_extractions(10)
        graph.invoke({"messages": [human("第二件事", id="u2")]}, thread("t"))
        [second] = graph.get_state(thread("t")).values["pending_extractions"]
    assert second["message_id"] == "u2", "the settled extraction left the list"
    assert wait_for_extractions(10)
    assert contents(store) == ["第一件事", "第二件事"]


def test_two_stores_each_extract_a_turn_with_the_same_thread_and_message_ids(tmp_path):
    """Keys are one store's: another store of the process (another graph, an earlier test)
    may hold a turn under the same thread, message and reply ids, and still extracts it."""
    for name in ("first", "second"):
        with MemoryStore.open(tmp_path / name) as store:
            model = ScriptedChatModel(script=[AIMessage("嗯", id="r1")])
            graph = build_graph(make_config(model, memory=store, extractor=Remember()))
            graph.invoke({"messages": [human("同一句话", id="u1")]}, thread("t"))
            assert wait_for_extractions(10)
            assert contents(store) == ["同一句话"], f"the {name} store"


def test_a_full_queue_leaves_extractions_pending_and_loses_none(tmp_path, store, monkeypatch):
    monkeypatch.setattr(pipeline, "QUEUE_CAPACITY", 2)
    monkeypatch.setattr(pipeline, "SUBMIT_WAIT", 0.2)
    gate = threading.Event()
    extractor = Remember(gate)
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")] * 5), memory=store, extractor=extractor
    )
    deferred_before = extraction_stats().deferred
    with open_checkpointer(f"sqlite:///{tmp_path}/c.db") as saver:
        graph = build_graph(config, saver)
        for n in range(5):
            started = time.monotonic()
            graph.invoke({"messages": [human(f"事情{n}")]}, thread(f"q{n}"))
            assert time.monotonic() - started < 2.0, "a full queue delays a turn by its bound only"
            assert queue_depth() <= 2
        assert extraction_stats().deferred - deferred_before == 3
        gate.set()
        assert wait_for_extractions(10)
        assert contents(store) == ["事情0", "事情1"]
        assert resume_extractions(config, saver) == 3, "the deferred three were still recorded"
        assert wait_for_extractions(10)
    assert contents(store) == [f"事情{n}" for n in range(5)]
    assert sorted(extractor.calls) == [f"事情{n}" for n in range(5)], "each ran once"


def test_memories_land_while_turns_never_stop(store):
    """Four sessions turn back to back for 4 s, so no moment is free of turns: every
    memory older than 2 s is stored while they still run."""
    config = make_config(Endless(), memory=store, extractor=Remember())
    graph = build_graph(config)
    replied: dict[str, float] = {}
    end = time.monotonic() + 4.0

    def session(n: int) -> None:
        turn = 0
        while time.monotonic() < end:
            text = f"会话{n}第{turn}句"
            graph.invoke({"messages": [human(text)]}, thread(f"busy{n}"))
            replied[text] = time.monotonic()
            turn += 1

    sessions = [threading.Thread(target=session, args=(n,)) for n in range(4)]
    for t in sessions:
        t.start()
    for t in sessions:
        t.join()
    stored = set(contents(store))
    old = [text for text, at in replied.items() if at < end - 2.0]
    assert old, "the load produced turns"
    missing = [text for text in old if text not in stored]
    assert not missing, f"{len(missing)} of {len(old)} memories older than 2 s not stored"


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_claim_holds_while_its_owner_lives_and_lapses_when_it_is_gone(dead_pid):
    now, host = time.time(), socket.gethostname()
    later = now + 60

    def running(owner: str, until: float = later) -> Record:
        return Record("running", 1, owner, until)

    assert claimable(None, now)
    assert claimable(running(this_owner()), now), "this process retries its own claims"
    assert not claimable(running(f"{host}/{os.getppid()}/x"), now), "a live process holds it"
    assert claimable(running(f"{host}/{dead_pid}/x"), now), "a dead process on this host"
    assert claimable(running(f"{host}/{os.getpid()}/earlier-life"), now)
    assert not claimable(running("elsewhere/1/x"), now), "another host: wait for the lease"
    assert claimable(running("elsewhere/1/x", until=now - 1), now)
    assert not claimable(Record("done", 1), now) and not claimable(Record("lost", 3), now)


@pytest.mark.services
def test_on_a_chroma_server_the_ledger_is_shared_and_never_read_as_memories(
    chroma_server, tmp_path
):
    store = MemoryStore.connect(port=chroma_server)
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")]), memory=store, extractor=Remember()
    )
    thread_id = f"server-{time.time_ns()}"
    with open_checkpointer(f"sqlite:///{tmp_path}/c.db") as saver:
        graph = build_graph(config, saver)
        graph.invoke({"messages": [human("服务器上的事")]}, thread(thread_id))
        [entry] = graph.get_state(thread(thread_id)).values["pending_extractions"]
        assert wait_for_extractions(10)
        other_worker = MemoryStore.connect(port=chroma_server)  # its own client and ledger
        assert unfinished(other_worker, [entry["key"]]) == set(), "done, as every worker sees"
        other = config.model_copy(update={"memory": other_worker})
        assert resume_extractions(other, saver) == 0
    listed = other_worker.list()
    assert [i.content for i in listed].count("服务器上的事") == 1
    assert LEDGER_COLLECTION in [c.name for c in store.client.list_collections()]
    assert entry["key"] not in {i.id for i in listed}, "a ledger record never reads as a memory"


class DictBackend:
    """A memory backend of one's own: no Chroma, no shared ledger."""

    def __init__(self) -> None:
        self.items: dict[str, MemoryItem] = {}

    def search(
        self, query: str, persona_id: str | None = None, restricted: bool = False, k: int = 8
    ):
        return []

    def add_many(self, items):
        self.items.update((i.id, i) for i in items)
        return [i.id for i in items]


def extracted_into(backend: DictBackend, text: str) -> list[str]:
    """What one turn saying `text` leaves in `backend`, once its extraction has run."""
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")]), memory=backend, extractor=Remember()
    )
    build_graph(config).invoke({"messages": [human(text)]}, thread(f"own-{text}"))
    assert wait_for_extractions(10)
    return [i.content for i in backend.items.values()]


def test_a_backend_without_chroma_still_extracts_in_the_background(caplog):
    assert extracted_into(DictBackend(), "自带的存储") == ["自带的存储"]
    assert "completion only in this process" in caplog.text


class ServerBackend(DictBackend):
    """A third-party backend whose memories live on a server every worker reaches (a
    shared dict and a SQLite file stand in for it): it provides its extraction ledger
    there too, beside the memories (`nodes.extraction.ledger.ProvidesExtractionLedger`)."""

    def __init__(self, server: dict[str, MemoryItem], ledger: Path) -> None:
        super().__init__()
        self.items, self.ledger = server, ledger

    def extraction_ledger(self) -> ExtractionLedger:
        return SqliteExtractionLedger(self.ledger)


def test_a_backend_that_provides_its_ledger_shares_it_with_every_worker(tmp_path, caplog):
    server: dict[str, MemoryItem] = {}
    mine, extractor = ServerBackend(server, tmp_path / "ledger.db"), Remember()
    assert isinstance(mine, ProvidesExtractionLedger)
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")]), memory=mine, extractor=extractor
    )
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        graph.invoke({"messages": [human("服务器上的另一件事")]}, thread("srv"))
        [entry] = graph.get_state(thread("srv")).values["pending_extractions"]
    assert wait_for_extractions(10)
    # Another worker: its own backend object and its own pipeline, the same server.
    theirs = ServerBackend(server, tmp_path / "ledger.db")
    assert unfinished(theirs, [entry["key"]]) == set(), "done, as every worker sees"
    job = ExtractionJob(
        key=entry["key"],
        extract=lambda earlier=(): extractor.extract([human("服务器上的另一件事")]),
        persona_id=None,
        source=Source(session_id="srv"),
        store=theirs,
    )
    other_worker = Pipeline()
    assert other_worker.submit(job) and other_worker.wait(10)
    assert job.stats.skipped == 1, "its pipeline reads the server's ledger and skips the job"
    assert extractor.calls == ["服务器上的另一件事"], "extracted once, by the first worker"
    assert [i.content for i in server.values()] == ["服务器上的另一件事"]
    assert "completion only in this process" not in caplog.text


class ReadWriteLedger:
    """A ledger written for the old protocol: read and write, no compare-and-swap."""

    def read(self, keys: list[str]) -> dict[str, Record]:
        return {}

    def write(self, records: dict[str, Record]) -> None:
        pass


class ReadWriteBackend(DictBackend):
    def extraction_ledger(self) -> ReadWriteLedger:
        return ReadWriteLedger()


def test_a_ledger_that_cannot_claim_atomically_is_refused_loudly(caplog):
    assert extracted_into(ReadWriteBackend(), "旧账本") == ["旧账本"], "extracted all the same"
    assert "not an ExtractionLedger (read, swap, write)" in caplog.text


@pytest.mark.slow
@pytest.mark.services
def test_a_chroma_server_that_goes_down_delays_a_memory_and_loses_nothing(tmp_path, caplog):
    """The server stops while the extractor runs: the write and the done mark wait and are
    tried again, nothing is called lost, and once the server is back the memory lands,
    extracted once."""
    port, gate = free_port(), threading.Event()
    extractor = Remember(gate)
    before = extraction_stats()
    with chroma_run(tmp_path, port), open_checkpointer("memory") as saver:
        store = MemoryStore.connect(port=port, embedding_function=HashingEmbedding())
        config = make_config(
            ScriptedChatModel(script=[AIMessage("嗯")]), memory=store, extractor=extractor
        )
        graph = build_graph(config, saver)
        graph.invoke({"messages": [human("服务器停了也要记住")]}, thread("down"))
        [entry] = graph.get_state(thread("down")).values["pending_extractions"]
        deadline = time.monotonic() + 10
        while not extractor.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert extractor.calls, "claimed, and extracting"
    gate.set()  # the server is down: the write fails
    time.sleep(2.0)
    assert queue_depth() == 1, "still in hand"
    down = extraction_stats()
    assert down.setbacks - before.setbacks >= 2 and down.lost == before.lost
    assert "its memories are lost" not in caplog.text
    with chroma_run(tmp_path, port):
        assert wait_for_extractions(40)
        assert [i.content for i in store.list()] == ["服务器停了也要记住"]
        assert unfinished(store, [entry["key"]]) == set(), "marked done"
    after = extraction_stats()
    assert extractor.calls == ["服务器停了也要记住"], (
        "extracted once, stored when the server came back"
    )
    assert (after.succeeded - before.succeeded, after.lost - before.lost) == (1, 0)
    assert "its memories are lost" not in caplog.text
