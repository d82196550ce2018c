"""OpenTelemetry: the span tree of a turn, its session attributes, no restricted text,
and the CLI exporting over real OTLP/HTTP to a receiver on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Command
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graph import SessionEnv, build_graph, open_checkpointer
from graph.tracing import enable_tracing
from tests.conftest import REPO, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

SECRET = "我的银行卡密码是 314159"


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = enable_tracing(exporter)
    yield exporter, provider
    provider.shutdown()


def tree(spans: list[ReadableSpan]) -> list[str]:
    """`depth name` per span, children in start order."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time or 0):
            lines.append("  " * depth + span.name)
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return lines


def test_a_turn_is_a_span_per_run_node_model_call_and_tool_call(spans):
    found = run_and_collect(spans, SessionEnv(actor="owner", persona_id="aglaea"), None)
    assert tree(found) == [
        "cyrene",
        "  call_model",
        "    ScriptedChatModel",
        "  dispatch_tools",
        "    get_time",
        "  call_model",
        "    ScriptedChatModel",
    ]
    facts = {
        span.name + str(span.attributes.get("cyrene.round")): {
            k: v for k, v in span.attributes.items() if k.startswith("cyrene.")
        }
        for span in found
    }
    owner = {"cyrene.session_id": "t1", "cyrene.actor": "owner", "cyrene.persona": "aglaea"}
    assert facts["ScriptedChatModel1"] == {**owner, "cyrene.round": 1}
    assert facts["get_time1"] == {**owner, "cyrene.round": 1}, "the round that asked for it"
    assert facts["ScriptedChatModel2"] == {**owner, "cyrene.round": 2}
    assert facts["cyrene2"] == {**owner, "cyrene.round": 2}, "the run: its last round"
    [first_call] = [
        s for s in found if s.name == "ScriptedChatModel" and s.attributes["cyrene.round"] == 1
    ]
    assert first_call.attributes["openinference.span.kind"] == "LLM"
    assert SECRET in str(dict(first_call.attributes)), "an owner's turn is traced whole"


def run_and_collect(
    spans: tuple[InMemorySpanExporter, TracerProvider], env: SessionEnv, name: str | None
) -> list[ReadableSpan]:
    """A turn with a tool round (the model asks for the time, then answers), its spans."""
    exporter, provider = spans
    model = ScriptedChatModel(script=[tool_calls(call("get_time", "c1")), AIMessage("八点半")])
    config = make_config(model, restricted_tools={"get_time"})
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        graph.invoke({"messages": [HumanMessage(SECRET, name=name)]}, thread("t1"), context=env)
    provider.force_flush()
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize("actor", ["group", "stranger"])
def test_a_restricted_sessions_words_never_reach_a_span(spans, actor):
    found = run_and_collect(spans, SessionEnv(actor=actor), "小明")
    assert len(tree(found)) == 7, "the same spans"
    for span in found:
        shown = f"{span.name} {dict(span.attributes)} {span.events} {span.status.description}"
        assert "314159" not in shown and "八点半" not in shown and "小明" not in shown, shown
        assert span.attributes["cyrene.actor"] == actor
        assert span.attributes["cyrene.persona"] == "xilian", "restricted: the default persona"
    [tool] = [s for s in found if s.name == "get_time"]
    assert tool.attributes["tool.name"] == "get_time" and tool.attributes["cyrene.round"] == 1


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's trace endpoint: it keeps what it is sent."""

    received: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        Receiver.received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_cli_exports_over_otlp_http_when_the_endpoint_is_set(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Receiver.received = []
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "OTEL_SERVICE_NAME": "cyrene-test",
    }
    env.pop("CYRENE_MODEL", None)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "studio.cli.main",
                "run",
                "现在几点？",
                "--session",
                "otlp",
                "--data",
                str(tmp_path),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    spans = [
        (span.name, {a.key: a.value for a in span.attributes})
        for request in Receiver.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    services = {
        a.value.string_value
        for request in Receiver.received
        for resource in request.resource_spans
        for a in resource.resource.attributes
        if a.key == "service.name"
    }
    names = [name for name, _ in spans]
    assert services == {"cyrene-test"}
    assert names.count("call_model") == 2 and "get_time" in names and "cyrene" in names
    [run] = [attrs for name, attrs in spans if name == "cyrene"]
    assert run["cyrene.session_id"].string_value == "otlp"
    assert run["cyrene.actor"].string_value == "owner"


# -- every door of a restricted thread (issue 28, finding 4) ---------------------------


class Down(Exception):
    """The provider fails the turn; its message is stored, resumable."""


def down(messages: list) -> AIMessage:
    raise Down("provider down")


def said(text: str = SECRET) -> dict:
    return {"messages": [HumanMessage(text, name="小明")]}


DOORS = ("update_state", "Command", "resume", "update_state, unopened thread")


async def through(graph, door: str, run: str) -> None:
    """One run through `door` on thread t1 (opened as a group), sync or async."""
    session = thread("new" if door.endswith("unopened thread") else "t1")
    if door.startswith("update_state"):
        edit = graph.update_state if run == "sync" else graph.aupdate_state
        result = edit(session, said())
    else:
        step = Command(update=said()) if door == "Command" else None
        invoke = graph.invoke if run == "sync" else graph.ainvoke
        result = invoke(step, session, context=SessionEnv())
    if run == "async":
        await result


@pytest.mark.parametrize("run", ["sync", "async"])
@pytest.mark.parametrize("door", DOORS)
async def test_every_door_of_a_group_thread_keeps_its_words_out_of_spans(spans, door, run):
    exporter, provider = spans
    first = down if door == "resume" else AIMessage("好")
    model = ScriptedChatModel(script=[first, AIMessage("好"), AIMessage("好")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        with suppress(Down):  # the resume door continues this failed turn
            graph.invoke(said("开场"), thread("t1"), context=SessionEnv(actor="group"))
        provider.force_flush()
        exporter.clear()
        await through(graph, door, run)
    provider.force_flush()
    found = list(exporter.get_finished_spans())
    # An unopened thread's edit runs as START, which writes untraced (`write_fixed_start`).
    assert found or door == "update_state, unopened thread", "the door made spans"
    expected = "unbound" if door.endswith("unopened thread") else "group"
    for span in found:
        shown = f"{span.name} {dict(span.attributes)} {span.events}"
        assert "314159" not in shown and "小明" not in shown, shown
        assert span.attributes.get("cyrene.actor") == expected, span.name


@pytest.mark.parametrize("limit", [200, 600])
def test_a_span_whose_metadata_a_length_limit_cut_keeps_no_text(limit):
    """The SDK's own OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT cuts the JSON the actor is read from:
    such a span keeps none of its text (it fails closed), in a process of its own."""
    code = f"""
import os
os.environ["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"] = "{limit}"
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from langchain_core.messages import HumanMessage
from graph import SessionEnv, build_graph, open_checkpointer
from graph.tracing import enable_tracing
from tests.boundary_support import endless
from tests.conftest import make_config, thread
exporter = InMemorySpanExporter()
provider = enable_tracing(exporter)
with open_checkpointer("memory") as saver:
    graph = build_graph(make_config(endless()), saver)
    said = {{"messages": [HumanMessage("{SECRET}", name="小明")]}}
    graph.invoke(said, thread("t" * 200), context=SessionEnv(actor="group"))
provider.force_flush()
spans = exporter.get_finished_spans()
print(len(spans), sum("314159" in str(dict(s.attributes)) for s in spans))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    spans, leaking = map(int, out.stdout.split())
    assert spans >= 3 and leaking == 0  # the run, its node and its model call
