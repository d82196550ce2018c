"""Round policies from outside the package, through the public API: a new per-round
behaviour is one class in `LoopConfig(policies=[...])`, and it runs in sync, async and
Studio's graph alike."""

from __future__ import annotations

import importlib
import logging
import threading

import pytest
from langchain_core.messages import AIMessage

from graph import (
    LoopConfig,
    ModelCall,
    Reply,
    Round,
    RoundPolicy,
    SessionEnv,
    build_graph,
    open_checkpointer,
)
from tests.conftest import human, make_config, thread
from tests.scripted import ScriptedChatModel


class Signature(RoundPolicy):
    """A small outside policy with every hook: it notes the view's length before the
    model, sends a request parameter, and signs the reply after."""

    blocking = False

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.threads: list[int] = []

    def before_model(self, round: Round) -> None:
        self.seen.append((round.number, len(round.view)))
        self.threads.append(threading.get_ident())

    def wrap_model_call(self, round: Round, request: ModelCall, call):
        return (yield from call(request.override(settings={**request.settings, "seed": 7})))

    def after_model(self, round: Round, reply: Reply) -> None:
        text = reply.message.text
        reply.message = reply.message.model_copy(update={"content": f"{text}（签名）"})


def signed_graph(model: ScriptedChatModel, saver, policy: RoundPolicy, **overrides):
    return build_graph(make_config(model, policies=[policy], **overrides), saver)


def assert_signed(policy: Signature, model: ScriptedChatModel, messages) -> None:
    assert policy.seen == [(1, len(model.requests[0].messages))]
    assert model.requests[0].kwargs.get("seed") == 7
    assert messages[-1].content == "好（签名）" and messages[-1].name == "xilian"


def test_an_outside_policy_runs_in_a_sync_turn():
    model, policy = ScriptedChatModel(script=[AIMessage("好")]), Signature()
    with open_checkpointer("memory") as saver:
        out = signed_graph(model, saver, policy).invoke(
            {"messages": [human("早")]}, thread("p1"), context=SessionEnv()
        )
    assert_signed(policy, model, out["messages"])


async def test_an_outside_policy_runs_in_an_async_turn_on_the_event_loop_when_it_does_not_block():
    model, policy = ScriptedChatModel(script=[AIMessage("好")]), Signature()
    async with open_checkpointer("memory") as saver:
        out = await signed_graph(model, saver, policy).ainvoke(
            {"messages": [human("早")]}, thread("p2"), context=SessionEnv()
        )
    assert_signed(policy, model, out["messages"])
    assert policy.threads == [threading.get_ident()], "a non-blocking policy needs no thread hop"


async def test_a_blocking_policy_runs_off_the_event_loop():
    model, policy = ScriptedChatModel(script=[AIMessage("好")]), Signature()
    policy.blocking = True
    async with open_checkpointer("memory") as saver:
        await signed_graph(model, saver, policy).ainvoke(
            {"messages": [human("早")]}, thread("p3"), context=SessionEnv()
        )
    assert policy.threads and policy.threads[0] != threading.get_ident()


def test_an_outside_policy_runs_in_studios_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("CYRENE_DATA", str(tmp_path))
    # The module builds the server's graph when it is imported: over tmp_path, here.
    studio_graph = importlib.import_module("studio.graph")
    policy = Signature()
    config = studio_graph.make_config(policies=[policy])
    try:
        graph = studio_graph.make_graph(config)
        updates = list(
            graph.stream({"messages": [human("早安")]}, stream_mode="updates", context=SessionEnv())
        )
    finally:
        config.memory.close()
        studio_graph.config.memory.close()
    nodes = [node for update in updates for node in update]
    assert "assemble_context" in nodes, "Studio's graph shows the view as a step of its own"
    reply = next(u["call_model"] for u in updates if "call_model" in u)["messages"][0]
    assert reply.content.endswith("（签名）") and policy.seen[0][0] == 1


class Quiet(RoundPolicy):
    """Answers the round itself: no model call."""

    blocking = False

    def before_model(self, round: Round) -> None:
        round.answer(messages=[AIMessage("（安静）", name=round.label)])


def test_a_policy_that_answers_the_round_means_no_model_call():
    model = ScriptedChatModel(script=[])
    with open_checkpointer("memory") as saver:
        out = build_graph(make_config(model, policies=[Quiet()]), saver).invoke(
            {"messages": [human("早")]}, thread("q"), context=SessionEnv()
        )
    assert model.requests == [] and out["messages"][-1].content == "（安静）"


class Broken(RoundPolicy):
    blocking = False

    def before_model(self, round: Round) -> None:
        raise RuntimeError("policy bug")


def test_a_failing_policy_is_logged_and_the_turn_goes_on(caplog):
    model = ScriptedChatModel(script=[AIMessage("好")])
    with open_checkpointer("memory") as saver, caplog.at_level(logging.ERROR):
        out = build_graph(make_config(model, policies=[Broken()]), saver).invoke(
            {"messages": [human("早")]}, thread("b"), context=SessionEnv()
        )
    assert out["messages"][-1].content == "好"
    assert "round policy Broken failed in before_model" in caplog.text


def test_policies_must_be_round_policies():
    with pytest.raises(ValueError, match=r"policies\[0\]: expected a RoundPolicy, got function"):
        LoopConfig(model=ScriptedChatModel(), policies=[lambda round: None])
