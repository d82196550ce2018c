"""Provider failures and replies that cannot run safely (issue 11).

Hosted models return 429s, 5xx and timeouts, and cut replies off at the token
limit. The model is the only fake: `FlakyModel` raises the SDKs' real
exception types before it answers from its script; everything else (graph,
SQLite saver, ToolNode, the providers' own request formatters) is real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import Field, PrivateAttr

from graph import (
    CapacityPolicy,
    Fallbacks,
    Tier,
    ToolCalls,
    ToolHooks,
    build_graph,
    open_checkpointer,
)
from nodes.kernel.provider_errors import ModelCallTimeout, is_transient
from tests.conftest import human, make_config, owner, thread
from tests.payload_checks import payload_problems
from tests.scripted import Request, ScriptedChatModel, call, tool_calls

OPENAI_URL = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
ANTHROPIC_URL = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
FAST = dict(initial_interval=0.01, backoff_factor=2.0, jitter=False)


def fast_retries(retries: int) -> dict:
    """`retries` retries after the first attempt, with short waits and no jitter."""
    return {"retry": {**FAST, "max_attempts": retries + 1}}


def openai_status(code: int) -> openai.APIStatusError:
    kind = {
        429: openai.RateLimitError,
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
    }
    cls = kind.get(code, openai.InternalServerError)
    return cls(f"status {code}", response=httpx.Response(code, request=OPENAI_URL), body=None)


def anthropic_status(code: int) -> anthropic.APIStatusError:
    kind = {429: anthropic.RateLimitError, 529: anthropic.OverloadedError}
    cls = kind.get(code, anthropic.InternalServerError)
    return cls(f"status {code}", response=httpx2.Response(code, request=ANTHROPIC_URL), body=None)


def http_status(code: int) -> httpx.HTTPStatusError:
    response = httpx.Response(code, request=OPENAI_URL)
    return httpx.HTTPStatusError(f"status {code}", request=OPENAI_URL, response=response)


def rate_limit() -> BaseException:
    return openai_status(429)


def connect_error() -> BaseException:
    return httpx.ConnectError("connection refused", request=OPENAI_URL)


def openai_timeout() -> BaseException:
    return openai.APITimeoutError(request=OPENAI_URL)


TRANSIENT: list[Callable[[], BaseException]] = [
    lambda: openai_status(429),
    lambda: openai_status(500),
    lambda: openai_status(503),
    lambda: openai.APITimeoutError(request=OPENAI_URL),
    lambda: openai.APIConnectionError(request=OPENAI_URL),
    lambda: anthropic_status(429),
    lambda: anthropic_status(529),
    lambda: anthropic_status(500),
    lambda: anthropic.APITimeoutError(request=ANTHROPIC_URL),
    lambda: anthropic.APIConnectionError(request=ANTHROPIC_URL),
    lambda: httpx.ConnectError("connection refused", request=OPENAI_URL),
    lambda: httpx.ReadTimeout("read timed out", request=OPENAI_URL),
    lambda: http_status(429),
    lambda: http_status(502),
    lambda: ConnectionResetError("peer reset"),
    lambda: ModelCallTimeout(5.0),
]
PERMANENT: list[Callable[[], BaseException]] = [
    lambda: openai_status(400),
    lambda: openai_status(401),
    lambda: http_status(404),
    lambda: ValueError("System message must be at the beginning"),
    lambda: KeyError("x"),
]


@pytest.mark.parametrize("make", TRANSIENT)
def test_rate_limits_5xx_timeouts_and_connection_errors_are_transient(make):
    assert is_transient(make())


@pytest.mark.parametrize("make", PERMANENT)
def test_client_errors_and_bugs_are_not_transient(make):
    assert not is_transient(make())


def test_a_transient_cause_makes_a_wrapping_error_transient():
    try:
        raise RuntimeError("provider call failed") from httpx.ConnectError("down")
    except RuntimeError as exc:
        assert is_transient(exc)


class FlakyModel(ScriptedChatModel):
    """Raises `errors` (one per call, in order), then answers from its script.

    Every call, failed or not, is recorded, so `len(requests)` counts attempts.
    """

    errors: list[Callable[[], BaseException]] = Field(default_factory=list)
    _failed: int = PrivateAttr(default=0)
    _times: list[float] = PrivateAttr(default_factory=list)

    def _next(self, messages: list, kwargs: dict[str, Any]) -> AIMessage:
        with self._lock:
            self._times.append(time.monotonic())
            if self._failed < len(self.errors):
                self._failed += 1
                self._requests.append(Request(list(messages), dict(kwargs)))
                raise self.errors[self._failed - 1]()
        return super()._next(messages, kwargs)


def always(make: Callable[[], BaseException], times: int = 50) -> list:
    return [make] * times


def humans(messages: list) -> list[str]:
    return [m.content for m in messages if isinstance(m, HumanMessage)]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_flaky_model_is_retried_until_it_answers(tmp_path, mode):
    errors = [lambda: openai_status(429), connect_error, lambda: anthropic_status(529)]
    model = FlakyModel(errors=errors, script=[AIMessage("早安")])
    config = make_config(model, **fast_retries(3))
    url = f"sqlite:///{tmp_path / 'c.db'}"
    turn = {"messages": [human("早", id="m1")]}
    if mode == "sync":
        with open_checkpointer(url) as saver:
            out = build_graph(config, saver).invoke(turn, thread("s"), context=owner())
    else:
        async with open_checkpointer(url) as saver:
            out = await build_graph(config, saver).ainvoke(turn, thread("s"), context=owner())
    assert len(model.requests) == 4, "three retries, then the answer"
    assert [(m.type, m.content) for m in out["messages"]] == [("human", "早"), ("ai", "早安")]


def test_waits_grow_between_attempts():
    model = FlakyModel(errors=always(rate_limit, 3), script=[AIMessage("ok")])
    config = make_config(
        model, retry=dict(max_attempts=4, initial_interval=0.05, backoff_factor=3.0, jitter=False)
    )
    build_graph(config).invoke({"messages": [human("hi")]}, thread("t"))
    gaps = [b - a for a, b in zip(model._times, model._times[1:], strict=False)]
    assert len(gaps) == 3
    assert gaps[0] >= 0.05 and gaps[1] >= 0.15 and gaps[2] >= 0.45


def test_retrying_off_means_one_attempt():
    model = FlakyModel(errors=[rate_limit], script=[AIMessage("ok")])
    graph = build_graph(make_config(model, retry=None))
    with pytest.raises(openai.RateLimitError):
        graph.invoke({"messages": [human("hi")]}, thread("off"))
    assert len(model.requests) == 1


def test_a_client_error_is_not_retried():
    model = FlakyModel(errors=[lambda: openai_status(400)], script=[AIMessage("ok")])
    graph = build_graph(make_config(model, **fast_retries(3)))
    with pytest.raises(openai.BadRequestError):
        graph.invoke({"messages": [human("hi")]}, thread("400"))
    assert len(model.requests) == 1


def test_exhausted_retries_leave_the_session_resumable(tmp_path):
    """The provider's own exception reaches the caller; the turn resumes later."""
    model = FlakyModel(errors=always(rate_limit, 3), script=[AIMessage("回来了")])
    config = make_config(model, **fast_retries(2))
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with open_checkpointer(url) as saver:
        graph = build_graph(config, saver)
        with pytest.raises(openai.RateLimitError) as failure:
            graph.invoke({"messages": [human("在吗", id="m1")]}, thread("r"), context=owner())
        state = graph.get_state(thread("r"))
    assert len(model.requests) == 3
    assert state.next == ("call_model",)
    assert humans(state.values["messages"]) == ["在吗"]
    assert any("resum" in note for note in getattr(failure.value, "__notes__", []))

    with open_checkpointer(url) as saver:  # later, say from another process
        out = build_graph(config, saver).invoke(None, thread("r"), context=owner())
    assert [(m.type, m.content) for m in out["messages"]] == [("human", "在吗"), ("ai", "回来了")]
    assert len(model.requests) == 4


async def test_exhausted_retries_leave_an_async_session_resumable(tmp_path):
    model = FlakyModel(errors=always(openai_timeout, 2), script=[AIMessage("回来了")])
    config = make_config(model, **fast_retries(1))
    async with open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        graph = build_graph(config, saver)
        with pytest.raises(openai.APITimeoutError):
            await graph.ainvoke({"messages": [human("在吗", id="m1")]}, thread("r"))
        state = await graph.aget_state(thread("r"))
        assert state.next == ("call_model",) and humans(state.values["messages"]) == ["在吗"]
        out = await graph.ainvoke(None, thread("r"))
    assert [m.content for m in out["messages"]] == ["在吗", "回来了"]
    assert len(model.requests) == 3


def test_fallback_models_take_over_once_retries_are_spent():
    primary = FlakyModel(errors=always(lambda: openai_status(503)), script=[])
    first = FlakyModel(errors=[connect_error], script=[])
    second = ScriptedChatModel(script=[AIMessage("备用模型在此")])
    config = make_config(primary, **fast_retries(2), features=[Fallbacks(models=[first, second])])
    out = build_graph(config).invoke({"messages": [human("hi")]}, thread("f"), context=owner())
    assert (len(primary.requests), len(first.requests), len(second.requests)) == (3, 1, 1)
    assert out["messages"][-1].content == "备用模型在此"
    assert out["messages"][-1].name == "xilian", "a fallback's reply is labelled like any other"
    assert second.requests[0].tool_names == ["get_time", "add", "explode"]


def test_a_client_error_goes_to_the_fallback_at_once():
    primary = FlakyModel(errors=[lambda: openai_status(400)], script=[])
    fallback = ScriptedChatModel(script=[AIMessage("ok")])
    config = make_config(primary, **fast_retries(3), features=[Fallbacks(models=[fallback])])
    build_graph(config).invoke({"messages": [human("hi")]}, thread("f"))
    assert (len(primary.requests), len(fallback.requests)) == (1, 1)


def test_when_every_model_fails_the_primary_error_names_the_fallbacks():
    primary = FlakyModel(errors=always(lambda: openai_status(503)), script=[])
    fallback = FlakyModel(errors=always(lambda: anthropic_status(529)), script=[])
    config = make_config(primary, **fast_retries(1), features=[Fallbacks(models=[fallback])])
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        with pytest.raises(openai.InternalServerError) as failure:
            graph.invoke({"messages": [human("hi")]}, thread("all"))
        assert graph.get_state(thread("all")).next == ("call_model",)
    assert (len(primary.requests), len(fallback.requests)) == (2, 1)
    notes = "\n".join(failure.value.__notes__)
    assert "fallback 1" in notes and "OverloadedError" in notes


def test_a_fallback_of_another_family_gets_the_view_its_provider_needs():
    """OpenAI gets attribution notes in place; Anthropic needs one leading system message."""
    primary = FlakyModel(script=[AIMessage("早")], provider="openai")  # turn 1 succeeds
    fallback = ScriptedChatModel(script=[AIMessage("在呢")], provider="anthropic")
    config = make_config(primary, retry=None, features=[Fallbacks(models=[fallback])])
    with open_checkpointer("memory") as saver:
        graph = build_graph(config, saver)
        graph.invoke({"messages": [human("早安")]}, thread("x"), context=owner())
        primary.errors = [lambda: openai_status(400)]
        out = graph.invoke({"messages": [human("在吗")]}, thread("x"), context=owner())
    assert out["messages"][-1].content == "在呢"
    sent_to_primary, sent_to_fallback = primary.requests[-1].messages, fallback.requests[0].messages
    assert [m.type for m in sent_to_primary].count("system") > 1, "inline notes for OpenAI"
    assert [m.type for m in sent_to_fallback].count("system") == 1
    assert sent_to_fallback[0].type == "system"
    assert payload_problems("anthropic", sent_to_fallback) == []


def test_fallback_model_strings_are_resolved_at_build():
    with pytest.raises(ValueError, match=r"Fallbacks.models\[0\]: cannot load chat model"):
        build_graph(
            make_config(ScriptedChatModel(), features=[Fallbacks(models=["nosuchprovider:x"])])
        )


@tool
def web_search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


def test_a_retried_round_runs_its_hooks_and_capacity_events_once():
    seen: list[str] = []
    hooks = ToolHooks(
        before_batch=lambda calls, env: seen.append("before_batch"),
        after_batch=lambda calls, results, env: seen.append("after_batch"),
    )
    policy = CapacityPolicy(
        tiers=(Tier(name="research", tools=("web_search",), triggers=("搜索",)),)
    )
    script = [tool_calls(call("web_search", "c1", query="猫")), AIMessage("找到了")]
    # Round 1 fails once before its tool call; round 2 fails once before the answer.
    model = ScriptedChatModel(script=[rate_limited, script[0], rate_limited, script[1]])
    config = make_config(
        model,
        tools=[web_search],
        **fast_retries(2),
        features=[
            policy.model_copy(update={"on_event": lambda event: seen.append(event.kind)}),
            ToolCalls(hooks=hooks),
        ],
    )
    out = build_graph(config).invoke({"messages": [human("搜索 猫")]}, thread("h"))
    assert out["messages"][-1].content == "找到了"
    assert len(model.requests) == 4
    assert seen == ["capacity_awaken", "before_batch", "after_batch"]


def rate_limited(messages: list) -> AIMessage:
    """A script entry: this call fails with a 429."""
    raise openai_status(429)


class SlowFirstModel(ScriptedChatModel):
    """The first call hangs for `hang` seconds; later calls answer at once."""

    hang: float = 5.0

    def _next(self, messages: list, kwargs: dict[str, Any]) -> AIMessage:
        first = not self._requests
        reply = super()._next(messages, kwargs)
        if first:
            time.sleep(self.hang)
        return reply


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_call_over_the_timeout_is_abandoned_and_retried(mode):
    model = SlowFirstModel(script=[AIMessage("太慢了"), AIMessage("好了")], hang=1.0)
    graph = build_graph(make_config(model, model_timeout=0.2, **fast_retries(1)))
    started = time.monotonic()
    turn = {"messages": [human("hi")]}
    if mode == "sync":
        out = graph.invoke(turn, thread("t"))
    else:
        out = await graph.ainvoke(turn, thread("t"))
    assert time.monotonic() - started < 0.9
    assert [m.content for m in out["messages"]] == ["hi", "好了"]


def test_a_timeout_with_retries_spent_reaches_the_caller():
    model = SlowFirstModel(script=[AIMessage("太慢了")], hang=1.0)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, model_timeout=0.1, retry=None), saver)
        with pytest.raises(ModelCallTimeout, match=r"0\.1"):
            graph.invoke({"messages": [human("hi")]}, thread("t"))
        assert graph.get_state(thread("t")).next == ("call_model",)


# -- replies that cannot run safely -------------------------------------------------------

RUNS: list[str] = []


@tool
def remember(text: str) -> str:
    """Write something down (a side effect the tests count)."""
    RUNS.append(text)
    return "ok"


@pytest.fixture(autouse=True)
def _reset_runs():
    RUNS.clear()


def reply_config(model, **overrides):
    return make_config(model, tools=[remember], **overrides)


CUT_OFF = [
    {"finish_reason": "length"},  # OpenAI
    {"stop_reason": "max_tokens"},  # Anthropic
    {"finish_reason": "MAX_TOKENS"},  # Gemini
    {"stop_reason": "model_context_window_exceeded"},  # Anthropic, output hit the window
]
FILTERED = [
    {"finish_reason": "content_filter"},  # OpenAI
    {"stop_reason": "refusal"},  # Anthropic
    {"finish_reason": "SAFETY"},  # Gemini
    {"finish_reason": "MALFORMED_FUNCTION_CALL"},  # Gemini
]


def said_why(metadata: dict[str, str]) -> str:
    if metadata in CUT_OFF:
        return "cut off at the output token limit"
    return f"stopped by the provider ({next(iter(metadata.values())).lower()})"


@pytest.mark.parametrize(
    "metadata",
    CUT_OFF + FILTERED,
    ids=[
        "openai",
        "anthropic",
        "gemini",
        "window",
        *(f"filter-{p}" for p in ("openai", "anthropic", "gemini", "malformed")),
    ],
)
def test_a_cut_off_reply_never_runs_its_tool_calls(metadata):
    """Whether the output limit or the provider's filter stopped the reply, what parsed of
    a call may be a prefix of what the model meant (`rm -rf /tmp/x` stopped at `rm -rf /`),
    and a stranger can steer a reply into the filter. Such calls are answered, never run."""
    cut = AIMessage(
        "我来记",
        tool_calls=[call("remember", "c1", text="买牛奶")],
        response_metadata=metadata,
    )
    model = ScriptedChatModel(script=[cut, AIMessage("请再说一遍")])
    out = build_graph(reply_config(model)).invoke({"messages": [human("记一下")]}, thread("c"))
    assert RUNS == []
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert result.status == "error" and result.tool_call_id == "c1"
    assert result.content.startswith("truncated:") and "again" in result.content
    assert f"your reply was {said_why(metadata)} before" in result.content
    assert len(model.requests) == 2, "the loop goes on to the next round"
    assert isinstance(model.requests[1].messages[-1], ToolMessage)
    assert out["messages"][-1].content == "请再说一遍"


def test_a_cut_off_reply_in_the_last_round_ends_the_turn():
    cut = AIMessage("", tool_calls=[call("remember", "c1", text="x")], response_metadata=CUT_OFF[0])
    model = ScriptedChatModel(script=[cut])
    out = build_graph(reply_config(model, features=[ToolCalls(max_rounds=1)])).invoke(
        {"messages": [human("go")]}, thread("c")
    )
    assert RUNS == [] and len(model.requests) == 1
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool"]


def invalid(call_id: str | None, name: str | None = "remember") -> dict:
    return {
        "name": name,
        "args": '{"text": "买牛',
        "id": call_id,
        "error": "Unterminated string starting at: line 1 column 10 (char 9)",
        "type": "invalid_tool_call",
    }


PROVIDERS = ["openai", "anthropic"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_invalid_tool_calls_get_the_parse_error_and_later_payloads_stay_valid(provider):
    broken = AIMessage(
        "",
        tool_calls=[call("remember", "c1", text="鸡蛋")],
        invalid_tool_calls=[invalid("c2"), invalid(None, name=None)],
    )
    script = [broken, AIMessage("记好了一半"), AIMessage("早")]
    model = ScriptedChatModel(script=script, provider=provider)
    graph = build_graph(reply_config(model))
    out = graph.invoke({"messages": [human("记两件事")]}, thread("i"), context=owner())
    graph.invoke({"messages": [human("早安")]}, thread("i"), context=owner())

    assert RUNS == ["鸡蛋"]
    errors = [m for m in out["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert len(errors) == 2
    assert all("Unterminated string" in m.content for m in errors)
    assert all(m.content.startswith("invalid_tool_call:") for m in errors)
    assert len(model.requests) == 3
    for request in model.requests:
        assert payload_problems(provider, request.messages) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tool_call_without_an_id_runs_once_and_the_session_goes_on(tmp_path, provider):
    idless = AIMessage("", tool_calls=[{"name": "remember", "args": {"text": "a"}, "id": None}])
    model = ScriptedChatModel(
        script=[idless, AIMessage("记了"), AIMessage("早")], provider=provider
    )
    with open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        graph = build_graph(reply_config(model), saver)
        out = graph.invoke({"messages": [human("记 a")]}, thread("n"))
        state = graph.get_state(thread("n"))
        graph.invoke({"messages": [human("早安")]}, thread("n"))
    assert RUNS == ["a"]
    stored_call = out["messages"][1].tool_calls[0]
    assert stored_call["id"] and out["messages"][2].tool_call_id == stored_call["id"]
    assert state.next == ()
    assert payload_problems(provider, model.requests[-1].messages) == []


def test_an_id_less_call_is_not_run_again_when_the_turn_resumes(tmp_path):
    idless = AIMessage("", tool_calls=[{"name": "remember", "args": {"text": "a"}, "id": None}])
    model = ScriptedChatModel(script=[idless, rate_limited, AIMessage("记了")])
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with open_checkpointer(url) as saver:
        graph = build_graph(reply_config(model, retry=None), saver)
        with pytest.raises(openai.RateLimitError):
            graph.invoke({"messages": [human("记 a")]}, thread("n"))
        assert graph.get_state(thread("n")).next == ("call_model",)
        out = graph.invoke(None, thread("n"))
    assert RUNS == ["a"]
    assert out["messages"][-1].content == "记了"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_repeated_ids_within_one_reply_get_ids_of_their_own(provider):
    twice = AIMessage(
        "",
        tool_calls=[call("remember", "dup", text="a"), call("remember", "dup", text="b")],
    )
    model = ScriptedChatModel(script=[twice, AIMessage("都记了")], provider=provider)
    out = build_graph(reply_config(model)).invoke({"messages": [human("记")]}, thread("d"))
    assert sorted(RUNS) == ["a", "b"]
    ids = [c["id"] for c in out["messages"][1].tool_calls]
    assert len(set(ids)) == 2 and ids[0] == "dup"
    assert {m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)} == set(ids)
    assert payload_problems(provider, model.requests[-1].messages) == []


def test_native_anthropic_blocks_follow_their_calls_new_ids():
    """Anthropic replies repeat each call as a `tool_use` block; both must carry the new id."""
    blocks = [
        {"type": "text", "text": "记两件"},
        {"type": "tool_use", "id": "dup", "name": "remember", "input": {"text": "a"}},
        {"type": "tool_use", "id": "dup", "name": "remember", "input": {"text": "b"}},
    ]
    twice = AIMessage(
        blocks,
        tool_calls=[call("remember", "dup", text="a"), call("remember", "dup", text="b")],
    )
    model = ScriptedChatModel(script=[twice, AIMessage("都记了")], provider="anthropic")
    out = build_graph(reply_config(model)).invoke({"messages": [human("记")]}, thread("d"))
    stored = out["messages"][1]
    block_ids = [b["id"] for b in stored.content if b["type"] == "tool_use"]
    assert block_ids == [c["id"] for c in stored.tool_calls] and len(set(block_ids)) == 2
    assert sorted(RUNS) == ["a", "b"]
    assert payload_problems("anthropic", model.requests[-1].messages) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_provider_that_numbers_every_replys_calls_alike_never_breaks_the_session(provider):
    """Some OpenAI-compatible servers call the first call of every reply `call_0`; Anthropic
    refuses a request that repeats a `tool_use` id, so the second turn would fail, and
    every turn after it. A call whose id the session already holds gets one of its own."""
    script = []
    for text in ("a", "b", "c"):
        script += [
            AIMessage("", tool_calls=[call("remember", "call_0", text=text)]),
            AIMessage("记了"),
        ]
    model = ScriptedChatModel(script=script, provider=provider)
    with open_checkpointer("memory") as saver:
        graph = build_graph(reply_config(model), saver)
        for text in ("记a", "记b", "记c"):
            out = graph.invoke({"messages": [human(text)]}, thread("n"))
    assert RUNS == ["a", "b", "c"], "each call ran once"
    asked = [c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert asked[0] == "call_0" and len(set(asked)) == 3
    answered = [m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answered == asked
    for checked in PROVIDERS:  # the session could fall back to either provider
        assert payload_problems(checked, [*out["messages"], human("下一句")]) == []


def test_a_call_id_another_provider_would_refuse_is_replaced_blocks_and_all():
    """Kimi-style ids (`functions.remember:0`) break an Anthropic fallback ("String should
    match pattern"); ids over 40 characters break an OpenAI one."""
    kimi, long_id = "functions.remember:0", "call_" + "x" * 40
    blocks = [
        {"type": "tool_use", "id": kimi, "name": "remember", "input": {"text": "a"}},
        {"type": "tool_use", "id": long_id, "name": "remember", "input": {"text": "b"}},
    ]
    reply = AIMessage(
        blocks, tool_calls=[call("remember", kimi, text="a"), call("remember", long_id, text="b")]
    )
    model = ScriptedChatModel(script=[reply, AIMessage("都记了")], provider="anthropic")
    out = build_graph(reply_config(model)).invoke({"messages": [human("记")]}, thread("k"))
    stored = out["messages"][1]
    ids = [c["id"] for c in stored.tool_calls]
    assert kimi not in ids and long_id not in ids and len(set(ids)) == 2
    assert [b["id"] for b in stored.content] == ids
    assert sorted(RUNS) == ["a", "b"]
    for checked in PROVIDERS:
        assert payload_problems(checked, [*out["messages"], human("下一句")]) == []
