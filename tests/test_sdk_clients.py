"""The provider clients `call_model` sends through (issue 32, findings 5, 7 and 9): one
attempt per call, so LangGraph's `RetryPolicy` is the only retry; the model's time limit;
a 200 that holds no reply raised as `MalformedReply`, and retried; usage asked for in
OpenAI-family streams."""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from graph import LoopConfig, build_graph, open_checkpointer
from nodes.core.loop import Loop
from nodes.kernel.provider_errors import MalformedReply
from tests.conftest import make_config, thread
from tests.emulator import Html, Status
from tests.emulator.fixtures import (  # noqa: F401
    anthropic_model,
    client,
    emulator,
    offline_tokenizer,
    openai_model,
)

PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
FAST_RETRY = {"initial_interval": 0.01, "max_interval": 0.02, "jitter": False}


def sdk_of(model) -> object:
    """The SDK client a chat model calls (ChatOpenAI's field, ChatAnthropic's cached one)."""
    return model.root_client if hasattr(model, "root_client") else model._client


@PROVIDERS
def test_the_sdk_makes_one_attempt_within_the_model_timeout(emulator, provider):
    model = client(emulator, provider)
    loop = Loop.from_config(LoopConfig(model=model, model_timeout=30))
    sdk = sdk_of(loop.default_model)
    assert (sdk.max_retries, sdk.timeout) == (0, 30)
    assert sdk_of(model).max_retries == 2, "the caller's own model is left as it was"


@PROVIDERS
def test_what_the_caller_set_on_the_sdk_stays(emulator, provider):
    model = client(emulator, provider, max_retries=1, timeout=5)
    loop = Loop.from_config(LoopConfig(model=model, model_timeout=30))
    assert sdk_of(loop.default_model) is sdk_of(model)
    emulator.inject(Status(500), times=None)
    config = make_config(model, retry={"max_attempts": 1})
    with open_checkpointer("memory") as saver, pytest.raises(Exception, match="500"):
        build_graph(config, saver).invoke({"messages": [HumanMessage("你好")]}, thread("p"))
    assert len(emulator.generations()) == 2, "its one SDK retry, under one attempt"


@PROVIDERS
def test_a_malformed_200_that_persists_fails_as_a_malformed_reply(emulator, provider):
    emulator.inject(Html(), times=None)
    config = make_config(client(emulator, provider), retry=FAST_RETRY)
    with open_checkpointer("memory") as saver, pytest.raises(MalformedReply, match="not a reply"):
        build_graph(config, saver).invoke({"messages": [HumanMessage("你好")]}, thread("m"))
    assert len(emulator.generations()) == 3


def streamed_turn_payload(emulator, model) -> dict:
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        inputs = {"messages": [HumanMessage("你好")]}
        for _ in graph.stream(inputs, thread("s"), stream_mode="messages"):
            pass
    return emulator.generations()[-1].payload


def test_an_openai_model_behind_a_custom_url_asks_for_stream_usage(emulator):
    payload = streamed_turn_payload(emulator, openai_model(emulator))
    assert payload["stream_options"] == {"include_usage": True}


def test_stream_usage_the_caller_turned_off_stays_off(emulator):
    assert "stream_options" not in streamed_turn_payload(
        emulator, openai_model(emulator, stream_usage=False)
    )
