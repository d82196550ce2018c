"""A worker process for the several-workers test: Postgres checkpoints, a Chroma server.

    python -m tests.workers_worker SPEC_JSON

It builds the loop the way a deployment's worker would: `open_checkpointer`
on a `postgresql://` URL, `MemoryStore.connect` to a `chroma run` server, a
background extractor. `SPEC_JSON` holds:

- `worker`, `dir` (files are exchanged there), `url`, `chroma_port`, `persona`;
- `turns`: `[session, turn]` pairs this worker sends; each session's turns go
  in order on a thread of their own, so sessions run side by side and several
  workers send to one session at once;
- `delay`: seconds each model call takes;
- `hang_at` (optional): the model call with this number touches
  `inside-<worker>` and never returns (the parent SIGKILLs the process there);
- `extract_delay` (optional): seconds each extraction takes;
- `takeover` (optional): once `takeover.json` appears (the turns of a killed
  worker), finish those sessions: resume an interrupted turn, send the turns
  not yet in the transcript, then `resume_extractions`.

The worker waits for `go`, prints one JSON line per message sent (`id`, and
`answered` or `error`), drains its background extraction and prints
`{"stats": …}`. Every extractor call appends `<worker> <message ids>` to
`calls.log`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import (
    LoopConfig,
    Persona,
    SessionEnv,
    build_graph,
    extraction_stats,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import MemoryItem, MemoryStore, Scope
from tests.scripted import ScriptedChatModel

PRINT = threading.Lock()


def say(record: dict) -> None:
    with PRINT:
        print(json.dumps(record, ensure_ascii=False), flush=True)


def message_id(tag: str, session: int, turn: int) -> str:
    return f"{tag}-s{session}-t{turn}"


def thread_id(tag: str, session: int) -> str:
    return f"{tag}-s{session}"


def memory_text(human_id: str) -> str:
    """The one memory a turn's message yields: it names its session and turn."""
    return f"{human_id} 的记忆"


def turn_humans(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The human messages the last turn answered (several when it merged a burst)."""
    humans: list[BaseMessage] = []
    for message in reversed(messages):
        if message.type == "human":
            humans.append(message)
        elif humans:
            break
    return humans[::-1]


class TurnExtractor:
    """A background extractor: one memory per message of the turn, logged per call."""

    background = True

    def __init__(self, worker: str, calls: Path, delay: float) -> None:
        self.worker, self.calls, self.delay = worker, calls, delay

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        humans = turn_humans(messages)
        with self.calls.open("a") as out:
            out.write(f"{self.worker} {' '.join(str(m.id) for m in humans)}\n")
        time.sleep(self.delay)
        return [
            MemoryItem(content=memory_text(str(m.id)), kind="turn", scope=Scope.PERSONA)
            for m in humans
        ]


def model_for(spec: dict) -> ScriptedChatModel:
    folder, worker, hang_at = Path(spec["dir"]), spec["worker"], spec.get("hang_at")
    count = {"n": 0}
    lock = threading.Lock()

    def reply(messages: list[BaseMessage]) -> AIMessage:
        with lock:
            count["n"] += 1
            number = count["n"]
        if number == hang_at:
            # Kill with an earlier turn's extraction under way (claimed, not stored).
            wait_for(folder / "calls.log", 30, lambda text: f"\n{worker} " in "\n" + text)
            (folder / f"inside-{worker}").touch()
            time.sleep(3600)  # inside the model call, until the SIGKILL
        return AIMessage("好的：" + "、".join(str(m.id) for m in turn_humans(messages)))

    return ScriptedChatModel(script=[reply] * (len(spec["turns"]) * 4 + 60), delay=spec["delay"])


def config_for(spec: dict, store: MemoryStore) -> LoopConfig:
    persona = spec["persona"]
    return LoopConfig(
        model=model_for(spec),
        personas={persona: Persona(name="昔涟")},
        default_persona=persona,
        memory=store,
        extractor=TurnExtractor(
            spec["worker"], Path(spec["dir"]) / "calls.log", spec.get("extract_delay", 0.0)
        ),
    )


def wait_for(
    path: Path, timeout: float = 120, holds: Callable[[str], bool] = lambda text: True
) -> None:
    """Block until `path` exists (and its text satisfies `holds`)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and holds(path.read_text())):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared (or never held what was waited for)")
        time.sleep(0.02)


class Worker:
    """One worker process's graph and what it sends."""

    def __init__(self, spec: dict, graph: Any, env: SessionEnv) -> None:
        self.spec, self.graph, self.env, self.tag = spec, graph, env, spec["tag"]

    def thread(self, session: int) -> dict:
        return {"configurable": {"thread_id": thread_id(self.tag, session)}}

    def send(self, session: int, turn: int) -> None:
        human_id = message_id(self.tag, session, turn)
        text = f"第{session}号会话的第{turn}句"
        try:
            state = self.graph.invoke(
                {"messages": [HumanMessage(text, id=human_id)]},
                self.thread(session),
                context=self.env,
            )
        except Exception as exc:
            say({"worker": self.spec["worker"], "id": human_id, "error": repr(exc)})
            return
        ids = [m.id for m in state["messages"]]
        answered = human_id in ids and any(
            m.type == "ai" for m in state["messages"][ids.index(human_id) :]
        )
        say({"worker": self.spec["worker"], "id": human_id, "answered": answered})

    def send_session(self, session: int, turns: list[int]) -> None:
        for turn in turns:
            self.send(session, turn)

    def run(self, pairs: list[list[int]]) -> None:
        by_session: dict[int, list[int]] = {}
        for session, turn in pairs:
            by_session.setdefault(session, []).append(turn)
        threads = [
            threading.Thread(target=self.send_session, args=(s, sorted(t)))
            for s, t in by_session.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def take_over(self, config: LoopConfig, saver: Any) -> None:
        """Finish a killed worker's sessions, and land its pending memories."""
        folder = Path(self.spec["dir"])
        wait_for(folder / "takeover.json")
        pairs = json.loads((folder / "takeover.json").read_text())
        resumed = 0
        for session in sorted({s for s, _ in pairs}):
            if self.graph.get_state(self.thread(session)).next:
                try:
                    self.graph.invoke(None, self.thread(session), context=self.env)
                    resumed += 1
                except ValueError:
                    pass  # another worker's turn on the session finished it first
        stored = {
            session: {m.id for m in self.graph.get_state(self.thread(session)).values["messages"]}
            for session in {s for s, _ in pairs}
        }
        missing = [[s, t] for s, t in pairs if message_id(self.tag, s, t) not in stored[s]]
        self.run(missing)
        recovered = resume_extractions(config, saver)
        say({"takeover": {"resumed": resumed, "resent": len(missing), "recovered": recovered}})


def main() -> None:
    spec = json.loads(sys.argv[1])
    # The log (stderr, `<worker>.log`) tells what each extraction became when a run fails.
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {spec['worker']} %(name)s %(message)s"
    )
    logging.getLogger("cyrene.memory").setLevel(logging.DEBUG)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    folder = Path(spec["dir"])
    store = MemoryStore.connect("127.0.0.1", spec["chroma_port"])
    config = config_for(spec, store)
    env = SessionEnv(actor="owner", persona_id=spec["persona"])
    with open_checkpointer(spec["url"]) as saver:
        worker = Worker(spec, build_graph(config, saver), env)
        helper = None
        if spec.get("takeover"):
            helper = threading.Thread(target=worker.take_over, args=(config, saver))
            helper.start()
        (folder / f"ready-{spec['worker']}").touch()
        wait_for(folder / "go")
        worker.run(spec["turns"])
        if helper is not None:
            helper.join()
        drained = wait_for_extractions(60)
    say({"stats": dataclasses.asdict(extraction_stats()), "drained": drained})
    sys.stdout.flush()
    os._exit(0)  # skips interpreter teardown; everything is saved and stored by now


if __name__ == "__main__":
    main()
