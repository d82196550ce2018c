"""A loop process for extraction crash tests: a turn whose background extraction is slow.

    python -m tests.extraction_crash_worker DATA MODE

DATA holds the embedded memory store, `calls.log` (one line per extractor
call, fsynced) and the SQLite checkpoints, unless CHECKPOINTS names another
saver URL; THREAD names the session (default "s"; recovery then looks at that
session alone, so a shared Postgres database does not mix tests). Modes:

- `turn`: one turn on session "s" ("记住 我喜欢乌龙茶", id u1); prints `replied`
  once `invoke` has returned, then waits for the extraction (or the SIGKILL);
- `next`: the session's next turn ("今天天气不错", id u2), then drains;
- `forget`: the session's next turn ("忘掉乌龙茶", id u3), then drains;
- `recover` / `arecover`: `resume_extractions` (sync / async saver) at start, then drains.

Every mode ends by printing `memories <json list>` and `stats <json>`.
EXTRACT_SECONDS makes the extractor sleep before answering; EXTRACT_FAIL=1
makes it raise; APPLY_SECONDS makes the store log `apply` to `calls.log` and
sleep before it applies an extraction's changes (its plan is recorded by then);
KILL_AT=index SIGKILLs the process between the write to Chroma and the lexical index's
update, KILL_AT=applied once the changes are applied, before the ledger marks them done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from graph import (
    LoopConfig,
    Persona,
    aresume_extractions,
    build_graph,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import MemoryItem, MemoryStore, Scope
from memory.lifecycle.operations import Change, Forget, Recalled
from nodes.extraction.background import extraction_stats
from nodes.kernel.messages import last_human, message_text
from tests.scripted import ScriptedChatModel

THREAD = os.environ.get("THREAD", "s")
TURNS = {
    "turn": HumanMessage("记住 我喜欢乌龙茶", id="u1"),
    "next": HumanMessage("今天天气不错", id="u2"),
    "forget": HumanMessage("忘掉乌龙茶", id="u3"),
}


def log_line(calls: Path, line: str) -> None:
    with calls.open("a") as out:
        out.write(f"{line}\n")
        out.flush()
        os.fsync(out.fileno())


class CountingExtractor:
    """Logs each call to a file, sleeps, then remembers what follows "记住" or forgets the
    closest memory shown for "忘掉"."""

    background = True

    def __init__(self, calls: Path) -> None:
        self.calls = calls

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        return [op for op in self.extract_operations(messages, []) if isinstance(op, MemoryItem)]

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> list[MemoryItem | Forget]:
        human = last_human(messages)
        text = message_text(human) if human else ""
        log_line(self.calls, f"call {text}")
        time.sleep(float(os.environ.get("EXTRACT_SECONDS", "0")))
        if os.environ.get("EXTRACT_FAIL") == "1":
            raise RuntimeError("extractor down")
        if text.startswith("忘掉"):
            return [Forget(memories[0].handle)] if memories else []
        if not text.startswith("记住 "):
            return []
        return [MemoryItem(content=text.removeprefix("记住 "), kind="like", scope=Scope.USER)]


class SlowStore(MemoryStore):
    """Logs `apply` and sleeps APPLY_SECONDS before applying changes (a crash lands there)."""

    calls: Path

    def apply(self, changes: Sequence[Change]) -> None:
        log_line(self.calls, "apply")
        time.sleep(float(os.environ.get("APPLY_SECONDS", "0")))
        if os.environ.get("KILL_AT") == "index":
            self._lexical.put = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[method-assign]
        super().apply(changes)
        if os.environ.get("KILL_AT") == "applied":
            os.kill(os.getpid(), signal.SIGKILL)


def report(store: MemoryStore) -> None:
    print("memories " + json.dumps([i.content for i in store.list()], ensure_ascii=False))
    print("stats " + json.dumps(dataclasses.asdict(extraction_stats())), flush=True)


def main() -> None:
    data, mode = Path(sys.argv[1]), sys.argv[2]
    store = SlowStore.open(data / "memory")
    store.calls = data / "calls.log"
    config = LoopConfig(
        model=ScriptedChatModel(script=[AIMessage("好的")] * 3),
        personas={"xilian": Persona(name="昔涟")},
        default_persona="xilian",
        memory=store,
        extractor=CountingExtractor(data / "calls.log"),
    )
    url = os.environ.get("CHECKPOINTS") or f"sqlite:///{data / 'checkpoints.db'}"
    only = [THREAD] if "THREAD" in os.environ else None
    if mode == "arecover":

        async def recover() -> None:
            async with open_checkpointer(url) as saver:
                print(f"resubmitted {await aresume_extractions(config, saver, only)}", flush=True)

        asyncio.run(recover())
    else:
        with open_checkpointer(url) as saver:
            if mode == "recover":
                print(f"resubmitted {resume_extractions(config, saver, only)}", flush=True)
            else:
                thread: RunnableConfig = {"configurable": {"thread_id": THREAD}}
                build_graph(config, saver).invoke({"messages": [TURNS[mode]]}, thread)
                print("replied", flush=True)
    wait_for_extractions(60)
    report(store)
    store.close()


if __name__ == "__main__":
    main()
