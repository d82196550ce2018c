"""Processes for the exactly-once race test, forked from one warm parent.

    python -m tests.exactly_once_worker          # reads one JSON spec a line on stdin

Starting a fresh interpreter costs about 2 s of CPU here (langgraph, chromadb,
psycopg), and the race test needs some two hundred processes. So this parent
imports everything once, starts no thread, and forks a child for each spec it
reads, answering `{"pid": …}` on stdout. Every child is a real, separate
process: its own pid (so its own claims in the extraction ledger), its own
Chroma client, its own checkpointer connection, its own extraction pipeline.
A child writes its log to `<dir>/<name>.log` and its result to
`<dir>/<name>.json` (renamed into place, so a reader never sees half of it).

A spec holds `role`, `name`, `dir`, `url` (the checkpointer), `port` (the Chroma
server), `thread`, and for a recoverer `threads` (the sessions to scan, or
null for all) and `at` (the wall-clock time to call `resume_extractions`, so
that two or three recoverers call it at the same moment). Roles:

- `turn`: one turn "记住 我喜欢乌龙茶" on `thread`; writes `{"key": …}` as soon as
  `invoke` returns, then lets its background extraction run and waits (the
  test SIGKILLs it at a random moment, before or after the extraction settled). Its store acknowledges each write up to 300 ms late,
  as over a slow network: the memory is on the server, the worker has not yet
  heard so, and has not marked the extraction done.
  With `ack` set, every acknowledgement takes that long. Once a write has
  landed it touches `<dir>/stored`.
- `recover`: `resume_extractions` at `at`, then drains; writes how many it
  resubmitted, whether it drained, and its extraction counts.
- `swap`: races the other `swap` children for `keys` in an extraction ledger
  (the SQLite file `<dir>/ledger.sqlite3`, or the server's when `port` is set),
  one compare-and-swap a key in the same order, at `at` and again two seconds later.

`items` (default 1) is how many facts the extractor finds.

The extractor is deliberately not deterministic, as a model is not: each call
words the memory with its pid and a counter, and appends `<pid> <n>` to
`<dir>/calls.log`. Every store embeds with `HashingEmbedding`: no process loads a model.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import chromadb
from chromadb.config import Settings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import (
    LoopConfig,
    Persona,
    build_graph,
    extraction_stats,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import HashingEmbedding, MemoryItem, MemoryStore, Scope
from nodes.extraction.ledger import (
    ChromaExtractionLedger,
    ExtractionLedger,
    Record,
    SqliteExtractionLedger,
    this_owner,
)
from tests.scripted import ScriptedChatModel

REMEMBER = "记住 我喜欢乌龙茶"
SLOW_ACK = 0.3
SWAP_STEP = 0.01
WARM = ("langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite", "chromadb.api.fastapi")
"""Modules the children would import lazily: imported once, here, before any fork."""


class ChangingExtractor:
    """A background extractor that words the same fact differently on every call; it finds
    `items` facts (the first is the tea)."""

    background = True

    def __init__(self, calls: Path, items: int = 1) -> None:
        self.calls = calls
        self.items = items
        self.counter = itertools.count(1)

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        n = next(self.counter)
        with self.calls.open("a") as out:
            out.write(f"{os.getpid()} {n}\n")
            out.flush()
            os.fsync(out.fileno())
        facts = ["主人喜欢乌龙茶", "主人住在杭州", "主人养了一只猫"][: self.items]
        return [
            MemoryItem(
                content=f"{fact}（进程 {os.getpid()} 第 {n} 次）", kind="like", scope=Scope.USER
            )
            for fact in facts
        ]


class SlowAckStore(MemoryStore):
    """A store on the server whose write acknowledgements arrive late: `ack` seconds, or
    0-300 ms. Once a write has landed it touches `stored` in `marks`."""

    marks = Path()
    ack: float | None = None

    def add_many(self, items: Iterable[MemoryItem]) -> list[str]:
        ids = super().add_many(items)
        (self.marks / "stored").touch()
        time.sleep(random.uniform(0, SLOW_ACK) if self.ack is None else self.ack)
        return ids


def config_for(spec: dict, store: MemoryStore) -> LoopConfig:
    return LoopConfig(
        model=ScriptedChatModel(script=[AIMessage("好的")]),
        personas={"xilian": Persona(name="昔涟")},
        default_persona="xilian",
        memory=store,
        extractor=ChangingExtractor(Path(spec["dir"]) / "calls.log", spec.get("items", 1)),
    )


def put(path: Path, record: dict) -> None:
    """Write a JSON file whole or not at all."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(record, ensure_ascii=False))
    part.rename(path)


def turn(spec: dict) -> dict:
    SlowAckStore.marks, SlowAckStore.ack = Path(spec["dir"]), spec.get("ack")
    store = SlowAckStore.connect("127.0.0.1", spec["port"], HashingEmbedding())
    thread: Any = {"configurable": {"thread_id": spec["thread"]}}
    with open_checkpointer(spec["url"]) as saver:
        graph = build_graph(config_for(spec, store), saver)
        graph.invoke({"messages": [HumanMessage(REMEMBER, id="u1")]}, thread)
        [pending] = graph.get_state(thread).values["pending_extractions"]
        put(Path(spec["dir"]) / "replied.json", {"key": pending["key"]})
        put(Path(spec["dir"]) / "drained.json", {"drained": wait_for_extractions(30)})
    time.sleep(120)  # until the SIGKILL: the test always kills a process that still runs
    return {}


def recover(spec: dict) -> dict:
    store = MemoryStore.connect("127.0.0.1", spec["port"], HashingEmbedding())
    with open_checkpointer(spec["url"]) as saver:
        config = config_for(spec, store)
        time.sleep(max(0.0, spec["at"] - time.time()))
        resubmitted = resume_extractions(config, saver, spec["threads"])
        drained = wait_for_extractions(30)
    return {
        "resubmitted": resubmitted,
        "drained": drained,
        "stats": dataclasses.asdict(extraction_stats()),
    }


def swap(spec: dict) -> dict:
    """Race the other children for `keys` in the ledger, one compare-and-swap a key, the
    i-th at `SWAP_STEP` × i past the round's start in every child (so they contend for
    each key at the same moment): at
    `at` from no record, at `at` + 2 from the record each read at `at` + 1.5. Returns the
    swaps won in each round, as (key, attempts of the record it replaced)."""
    if spec.get("port"):
        client = chromadb.HttpClient(
            port=spec["port"], settings=Settings(anonymized_telemetry=False)
        )
        ledger: ExtractionLedger = ChromaExtractionLedger(client)
    else:
        ledger = SqliteExtractionLedger(Path(spec["dir"]) / "ledger.sqlite3")
    keys, me = spec["keys"], this_owner()

    def race(seen: dict[str, Record], at: float) -> list[tuple[str, int]]:
        won: list[tuple[str, int]] = []
        for index, key in enumerate(keys):
            time.sleep(max(0.0, at + index * SWAP_STEP - time.time()))
            old = seen.get(key)
            new = Record("running", (old.attempts if old else 0) + 1, me, time.time() + 60)
            won += [(key, new.attempts - 1) for key in ledger.swap({key: (old, new)})]
        return won

    first = race({}, spec["at"])
    time.sleep(max(0.0, spec["at"] + 1.5 - time.time()))
    return {"rounds": [first, race(ledger.read(keys), spec["at"] + 2)]}


ROLES = {"turn": turn, "recover": recover, "swap": swap}


def child(spec: dict) -> None:
    """Run one role in a forked child, its output in its own files; never returns."""
    folder = Path(spec["dir"])
    log = os.open(folder / f"{spec['name']}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    random.seed()  # a fork copies the parent's random state
    code = 0
    try:
        put(folder / f"{spec['name']}.json", ROLES[spec["role"]](spec))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # none of the parent's exit handlers: they are not this process's


def reap(signum: int, frame: object) -> None:
    """Collect every child that ended (SIGKILLed ones too), so none stays a zombie."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def main() -> None:
    for module in WARM:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, reap)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            child(spec)
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
