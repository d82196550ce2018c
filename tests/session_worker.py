"""A worker process for the cross-process session tests: callers on one session.

    python -m tests.session_worker SPEC_JSON

`SPEC_JSON` holds `worker`, `mode` (`sync` or `async`), `dir` (the folder
files are exchanged in) and either:

- `scenarios`: a list of `{url, policy, thread, per_caller}`; before scenario k the
  worker waits for `go-k`, runs two callers sending `per_caller` messages each,
  prints one JSON line (`sent`, `rejected`, `unanswered`, `model_calls`) and
  writes `done-<worker>-k`;
- `url` and `sends`: a list of `{id, thread, after}`; each message is sent from its own
  caller once the file `after` exists, and prints `{id, answered}` (or
  `{id, error}`) when its call returns. `hold` (model call numbers) makes
  those calls write `calling-<worker>-<n>` and then wait for `release-<n>`,
  or forever when `hang` lists them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from graph import (
    LoopConfig,
    Persona,
    SessionBusyError,
    SessionEnv,
    Sessions,
    build_graph,
    open_checkpointer,
)
from tests.scripted import ScriptedChatModel

GROUP = SessionEnv(actor="group")


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def model_for(spec: dict) -> ScriptedChatModel:
    folder, worker = Path(spec["dir"]), spec["worker"]
    calls = {"n": 0}
    lock = threading.Lock()

    def reply(messages) -> AIMessage:
        with lock:
            calls["n"] += 1
            number = calls["n"]
        if number in spec.get("hold", []) or number in spec.get("hang", []):
            (folder / f"calling-{worker}-{number}").touch()
            while number in spec.get("hang", []) or not (folder / f"release-{number}").exists():
                time.sleep(0.01)
        humans = [m.content for m in messages if m.type == "human"]
        return AIMessage(f"{worker} 收到 {len(humans)} 句")

    return ScriptedChatModel(script=[reply] * 500, delay=spec.get("delay", 0.02))


def answers(state: dict, message_id: str) -> bool:
    ids = [m.id for m in state["messages"]]
    return message_id in ids and any(
        m.type == "ai" for m in state["messages"][ids.index(message_id) :]
    )


def message(message_id: str) -> dict:
    return {"messages": [HumanMessage(f"消息 {message_id}", id=message_id, name=message_id[:2])]}


class Caller:
    """Sends messages on one session and keeps score."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.score: dict[str, list[str]] = {"sent": [], "rejected": [], "unanswered": []}

    def record(self, message_id: str, state: Any) -> None:
        if isinstance(state, SessionBusyError):
            self.score["rejected"].append(message_id)
            return
        self.score["sent"].append(message_id)
        if not answers(state, message_id):
            self.score["unanswered"].append(message_id)

    def send(self, message_id: str, thread: str) -> None:
        config = {"configurable": {"thread_id": thread}}
        try:
            state: Any = self.graph.invoke(message(message_id), config, context=GROUP)
        except SessionBusyError as exc:
            state = exc
        self.record(message_id, state)

    async def asend(self, message_id: str, thread: str) -> None:
        config = {"configurable": {"thread_id": thread}}
        try:
            state: Any = await self.graph.ainvoke(message(message_id), config, context=GROUP)
        except SessionBusyError as exc:
            state = exc
        self.record(message_id, state)


def ids(spec: dict, scenario: dict, caller: int) -> list[str]:
    return [f"{spec['worker']}-{caller}-{i}" for i in range(scenario["per_caller"])]


def run_scenario(spec: dict, graph: Any, scenario: dict) -> dict:
    caller = Caller(graph)

    def one(n: int) -> None:
        for message_id in ids(spec, scenario, n):
            caller.send(message_id, scenario["thread"])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return caller.score


async def arun_scenario(spec: dict, graph: Any, scenario: dict) -> dict:
    caller = Caller(graph)

    async def one(n: int) -> None:
        for message_id in ids(spec, scenario, n):
            await caller.asend(message_id, scenario["thread"])

    await asyncio.gather(one(0), one(1))
    return caller.score


def build(spec: dict, saver: Any, policy: str = "merge") -> tuple[Any, ScriptedChatModel]:
    model = model_for(spec)
    config = LoopConfig(
        model=model,
        personas={"xilian": Persona(name="昔涟")},
        default_persona="xilian",
        features=[Sessions(busy_policy=policy)],
    )
    return build_graph(config, saver), model


def report(spec: dict, k: int, score: dict, model: ScriptedChatModel) -> None:
    print(json.dumps({**score, "model_calls": len(model.requests)}), flush=True)
    (Path(spec["dir"]) / f"done-{spec['worker']}-{k}").touch()


def outcome(item: dict, state: Any) -> None:
    if isinstance(state, Exception):
        print(json.dumps({"id": item["id"], "error": repr(state)}), flush=True)
    else:
        print(json.dumps({"id": item["id"], "answered": answers(state, item["id"])}), flush=True)


def send_one(spec: dict, graph: Any, item: dict) -> None:
    if item.get("after"):
        wait_for(Path(spec["dir"]) / item["after"])
    config = {"configurable": {"thread_id": item["thread"]}}
    try:
        state: Any = graph.invoke(message(item["id"]), config, context=GROUP)
    except Exception as exc:
        state = exc
    outcome(item, state)


async def asend_one(spec: dict, graph: Any, item: dict) -> None:
    if item.get("after"):
        await asyncio.to_thread(wait_for, Path(spec["dir"]) / item["after"])
    config = {"configurable": {"thread_id": item["thread"]}}
    try:
        state: Any = await graph.ainvoke(message(item["id"]), config, context=GROUP)
    except Exception as exc:
        state = exc
    outcome(item, state)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["mode"] == "async":
        asyncio.run(amain(spec))
    else:
        smain(spec)
    sys.stdout.flush()
    os._exit(0)  # skips ~1 s of interpreter teardown per worker; everything is saved by now


def smain(spec: dict) -> None:
    folder = Path(spec["dir"])
    (folder / f"ready-{spec['worker']}").touch()
    for k, scenario in enumerate(spec.get("scenarios", [])):
        with open_checkpointer(scenario["url"]) as saver:
            graph, model = build(spec, saver, scenario["policy"])
            wait_for(folder / f"go-{k}")
            report(spec, k, run_scenario(spec, graph, scenario), model)
    if sends := spec.get("sends"):
        with open_checkpointer(spec["url"]) as saver:
            graph = build(spec, saver)[0]
            threads = [threading.Thread(target=send_one, args=(spec, graph, s)) for s in sends]
            for t in threads:
                t.start()
            for t in threads:
                t.join()


async def amain(spec: dict) -> None:
    """The same, as coroutines: async savers belong to the loop that opened them."""
    folder = Path(spec["dir"])
    (folder / f"ready-{spec['worker']}").touch()
    for k, scenario in enumerate(spec.get("scenarios", [])):
        async with open_checkpointer(scenario["url"]) as saver:
            graph, model = build(spec, saver, scenario["policy"])
            await asyncio.to_thread(wait_for, folder / f"go-{k}")
            report(spec, k, await arun_scenario(spec, graph, scenario), model)
    if sends := spec.get("sends"):
        async with open_checkpointer(spec["url"]) as saver:
            graph = build(spec, saver)[0]
            await asyncio.gather(*(asend_one(spec, graph, s) for s in sends))


if __name__ == "__main__":
    main()
