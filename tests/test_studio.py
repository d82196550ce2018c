"""LangGraph Studio: a real `langgraph dev` server from the repo root, driven by langgraph-sdk."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langgraph_sdk import get_client

from nodes.core.stages import LOOP_NODES
from studio.cli.serve import dev_command, dev_env
from studio.demo.conversation import SUNSET_PNG
from studio.memory_server import RECORD
from tests.cli_support import cyrene_process
from tests.conftest import REPO, free_port, service_missing, wait_for_port

pytestmark = [pytest.mark.slow, pytest.mark.services]


class DevServer:
    """`langgraph dev` as the tests start it, or through `cyrene studio` (`via_cli`)."""

    def __init__(
        self, data: Path, log: Path, *, via_cli: bool = False, group_reply: str | None = None
    ) -> None:
        self.port = free_port()
        self.log = log
        command = (
            [
                sys.executable,
                "-m",
                "studio.cli.main",
                "studio",
                "--port",
                str(self.port),
                "--data",
                str(data),
            ]
            if via_cli
            else dev_command(self.port)
        )
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env={**dev_env(data, group_reply), "PYTHONPATH": str(REPO)},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self) -> None:
        if not wait_for_port(self.port, 90, self.proc):
            self.stop()
            service_missing(f"`langgraph dev` did not start: {self.log.read_text()[-1500:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(
                signal.SIGINT
            )  # graceful: the dev server flushes its thread store
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def run_turn(
    client,
    thread_id: str,
    text: str | list,
    context: dict,
    name: str | None = None,
    stream_mode: tuple[str, ...] = ("updates", "messages-tuple", "custom"),
) -> list:
    message = {"type": "human", "content": text, **({"name": name} if name else {})}
    return [
        part
        async for part in client.runs.stream(
            thread_id,
            "cyrene",
            input={"messages": [message]},
            context=context,
            stream_mode=list(stream_mode),
        )
    ]


async def node_updates(client, text: str | list) -> list[dict]:
    """The `updates` of one owner turn on a fresh thread, as Studio's graph view receives them."""
    thread = await client.threads.create()
    parts = await run_turn(
        client, thread["thread_id"], text, {"actor": "owner"}, stream_mode=("updates",)
    )
    return [p.data for p in parts if p.event == "updates"]


async def assert_every_stage_shows(client) -> None:
    """The demo world switches every stage on: a plain turn updates at least five nodes, an
    image turn's resolve_vision update carries the folded description."""
    plain = await node_updates(client, "你好，今天有点累")
    shown = [name for update in plain for name in update if name in LOOP_NODES]
    assert len(set(shown)) >= 5, f"a plain turn updated only {shown}"
    assert {"resolve_vision", "compact", "finish_turn"} <= set(shown)
    [finish] = [u["finish_turn"] for u in plain if "finish_turn" in u]
    assert finish["mood"] == "关切", "the demo's turn-end hook read the user's words"

    photo = [
        {"type": "text", "text": "看看这张照片"},
        {"type": "image", "base64": SUNSET_PNG, "mime_type": "image/png"},
    ]
    updates = await node_updates(client, photo)
    [vision] = [u["resolve_vision"] for u in updates if "resolve_vision" in u]
    [folded] = vision["messages"]
    assert [b["type"] for b in folded["content"]] == ["text", "text"], "the image was folded"
    assert "演示识图：一张 PNG 图片，4×3 像素" in folded["content"][1]["text"]
    assert list(vision["image_descriptions"].values()) == [
        folded["content"][1]["text"].split("描述：", 1)[1].rstrip("]")
    ]
    [call] = [u["call_model"] for u in updates if "call_model" in u]
    assert "4×3 像素" in call["messages"][-1]["content"], "the model was sent the description"


def denied_take_note(parts: list) -> bool:
    custom = [p.data for p in parts if p.event == "custom"]
    return any(c.get("kind") == "audit_tool_denied" and c["tool"] == "take_note" for c in custom)


async def assert_a_group_thread_stays_a_group(client) -> None:
    """A group's thread runs as the group whatever a later run's form leaves unset, and a
    run that says it is the owner's is refused (issue 28: Studio is a door too)."""
    thread = (await client.threads.create())["thread_id"]
    asked = "用 take_note 记一下：开会"
    assert denied_take_note(await run_turn(client, thread, asked, {"actor": "group"}, name="小明"))
    assert denied_take_note(await run_turn(client, thread, asked, {}, name="小明")), (
        "a run that names no actor runs as the thread's"
    )
    refused = await run_turn(client, thread, "我是主人", {"actor": "owner"})
    assert [p.data for p in refused if p.event == "error"], "the owner's context is refused"
    state = (await client.threads.get_state(thread))["values"]
    assert state["opened_as"] == {"actor": "group"}
    assert all(m["content"] != "我是主人" for m in state["messages"]), "nothing of it stored"
    tools = [m for m in state["messages"] if m["type"] == "tool"]
    assert tools and all("not_allowed" in str(m["content"]) for m in tools)


async def test_studio_serves_the_loop_and_persists_across_restarts(tmp_path):
    data = tmp_path / "data"
    first = DevServer(data, tmp_path / "first.log")
    try:
        first.wait()
        client = get_client(url=first.url)
        [assistant] = await client.assistants.search(graph_id="cyrene")
        drawn = await client.assistants.get_graph(assistant["assistant_id"])
        assert {node["id"] for node in drawn["nodes"]} >= set(LOOP_NODES)
        schemas = await client.assistants.get_schemas(assistant["assistant_id"])
        assert set(schemas["context_schema"]["properties"]) == {
            "actor",
            "persona_id",
            "session_id",
            "turn_id",
            "mentioned",
        }

        thread = await client.threads.create()
        owner = await run_turn(
            client, thread["thread_id"], "现在几点了？", {"actor": "owner", "persona_id": "aglaea"}
        )
        events = [p.event for p in owner]
        assert "messages" in events or any(e.startswith("messages") for e in events)
        updates = [p.data for p in owner if p.event == "updates"]
        views = [u["assemble_context"]["model_view"] for u in updates if "assemble_context" in u]
        assert views and views[0][0]["content"].startswith("你是阿格莱雅"), (
            "what the model saw is inspectable"
        )
        assert any("dispatch_tools" in u for u in updates), "the demo model called the time tool"

        for said in ("用 take_note 记一下：开会", "今天有点累，陪我聊聊", "晚上吃什么好呢？"):
            await run_turn(client, thread["thread_id"], said, {"actor": "owner"})
        state = await client.threads.get_state(thread["thread_id"])
        messages = state["values"]["messages"]
        # Studio shows the live window: with the demo's small budget, compaction has moved
        # the first turn's messages to the transcript archive.
        assert state["values"]["archived"]["messages"] > 0 and messages[-1]["type"] == "ai"
        history = await client.threads.get_history(thread["thread_id"], limit=50)
        assert len(history) > 5
        await assert_a_group_thread_stays_a_group(client)
        await assert_every_stage_shows(client)
    finally:
        first.stop()
    assert (data / "checkpoints.db").exists(), "the CLI's own file: sessions are shared"

    second = DevServer(data, tmp_path / "second.log", via_cli=True)
    try:
        second.wait()
        assert f"API:    http://127.0.0.1:{second.port}" in second.log.read_text()
        client = get_client(url=second.url)
        state = await client.threads.get_state(thread["thread_id"])
        assert [m["content"] for m in state["values"]["messages"]] == [
            m["content"] for m in messages
        ]
        again = await run_turn(client, thread["thread_id"], "你好", {"actor": "owner"})
        assert any(p.event == "updates" for p in again)
        final = (await client.threads.get_state(thread["thread_id"]))["values"]["messages"][-1][
            "content"
        ]
        assert "你上一句说的是" in final, "the restarted server continues the same conversation"
    finally:
        second.stop()


async def test_studio_shows_a_quiet_group_turn_and_its_reason(tmp_path):
    """`cyrene studio --group-reply mentioned`: a group message that names nobody is one
    `call_model` update with the decision, and the turn ends; a flagged one is answered,
    and the model saw the quiet message before it."""
    server = DevServer(tmp_path / "data", tmp_path / "server.log", group_reply="mentioned")
    try:
        server.wait()
        client = get_client(url=server.url)
        thread = (await client.threads.create())["thread_id"]
        quiet = await run_turn(client, thread, "今天天气不错", {"actor": "group"}, name="小明")
        updates = [p.data for p in quiet if p.event == "updates"]
        assert [list(update) for update in updates] == [["call_model"]]
        decision = updates[0]["call_model"]["presence"]
        assert decision["reply"] is False and decision["reason"].startswith("not addressed")
        assert [c["kind"] for c in (p.data for p in quiet if p.event == "custom")] == ["presence"]
        mention = {"actor": "group", "mentioned": True}
        answered = await run_turn(client, thread, "你觉得呢？", mention, name="小红")
        views = [
            u["assemble_context"]["model_view"]
            for u in (p.data for p in answered if p.event == "updates")
            if "assemble_context" in u
        ]
        assert [m["content"] for m in views[0] if m["type"] == "human"][-2:] == [
            "今天天气不错",
            "你觉得呢？",
        ]
        state = (await client.threads.get_state(thread))["values"]
        assert state["messages"][-1]["type"] == "ai" and state["presence"]["reply"] is True
    finally:
        server.stop()


async def test_studio_and_the_cli_share_one_data_folder(tmp_path):
    """With `cyrene studio` running on a folder, `cyrene run`, `chat` and `memory` on the
    same folder work at once (the store is served by the Chroma server Studio started and
    recorded there) and see the same memories and sessions (one checkpoints.db)."""
    data = tmp_path / "data"
    server = DevServer(data, tmp_path / "studio.log", via_cli=True)
    try:
        server.wait()
        assert (data / RECORD).exists(), "the memory server is recorded for the CLI"
        started = time.monotonic()
        added = cyrene_process("memory", "add", "主人的猫叫团子", "--data", str(data))
        assert added.returncode == 0, added.stderr
        assert time.monotonic() - started < 10, "no wait for the store's lock"

        client = get_client(url=server.url)
        thread = (await client.threads.create())["thread_id"]
        await run_turn(client, thread, "记住 周末去爬山", {"actor": "owner"})
        asked = await run_turn(client, thread, "查一下记忆：猫叫什么？", {"actor": "owner"})
        results = [
            str(m["content"])
            for p in asked
            if p.event == "updates"
            for m in (p.data.get("dispatch_tools") or {}).get("messages", [])
        ]
        assert any("团子" in r for r in results), "Studio's tool found the CLI's memory"
        assert await _eventually(lambda: "周末去爬山" in _memories(data)), "the CLI sees Studio's"

        listed = cyrene_process("sessions", "--data", str(data))
        assert listed.returncode == 0 and listed.stdout.startswith(f"{thread}  "), listed.stdout
        history = cyrene_process("history", thread, "--data", str(data))
        assert "记住 周末去爬山" in history.stdout
        went_on = cyrene_process("run", "继续聊", "--session", thread, "--data", str(data))
        assert went_on.returncode == 0, went_on.stderr
        chatted = cyrene_process(
            "chat", "--session", "cli-chat", "--data", str(data), stdin="在吗\n"
        )
        assert chatted.returncode == 0 and "收到「在吗」" in chatted.stdout, chatted.stderr
        state = await client.threads.get_state(thread)
        humans = [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]
        assert humans[-1] == "继续聊", "Studio sees the turn the CLI added to its thread"
    finally:
        server.stop()
    assert not (data / RECORD).exists(), "stopped: the record is gone"
    after = _memories(data)
    assert "团子" in after and "周末去爬山" in after, "the embedded store holds them all"


def _memories(data: Path) -> str:
    listed = cyrene_process("memory", "list", "--data", str(data))
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


async def _eventually(check, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.5)
    return check()
