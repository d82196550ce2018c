"""The provider emulator's own tests: its rules, its usage arithmetic, its faults, and the
real LangChain clients round-tripping through it (`tests/emulator`, issue 32).

Rules are sent raw (httpx), so each test sees the exact status and body the
emulator answers; the client tests use `ChatOpenAI` and `ChatAnthropic` as a
user of the project would.
"""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from tests.emulator import (
    BadSseLine,
    CutAfterToolName,
    CutStream,
    Drop,
    Emulator,
    Hang,
    Html,
    Reply,
    Status,
    call,
)
from tests.emulator.anthropic_rules import sign
from tests.emulator.fixtures import anthropic_model, client, emulator, openai_model  # noqa: F401
from tests.emulator.tokens import count
from tests.emulator.traffic import traffic_problems

OPENAI = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "你好"}]}
ANTHROPIC = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 4096,
    "messages": [{"role": "user", "content": "你好"}],
}
HEADERS = {
    "openai": {"authorization": "Bearer x"},
    "anthropic": {"x-api-key": "x", "anthropic-version": "2023-06-01"},
}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
THINKING = {"type": "enabled", "budget_tokens": 2048}


def post(api: Emulator, provider: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    """`body` sent raw to the provider's endpoint."""
    sent = {**HEADERS[provider], **headers}
    return httpx.post(api.url + PATHS[provider], json=body, headers=sent, timeout=5)


def openai_call(call_id: str = "call_1") -> dict[str, Any]:
    function = {"name": "get_time", "arguments": "{}"}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def tool_use(call_id: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "get_time", "input": {}}


def result(call_id: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "08:30"}


def turns(*messages: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in messages]


def thought(text: str = "想一想", signature: str | None = None) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature or sign(text)}


ASK = ("user", "几点了")
USE, RESULT, TEXT = (
    ("assistant", [tool_use()]),
    ("user", [result()]),
    {"type": "text", "text": "嗯"},
)
ROUND = turns(ASK, USE, RESULT)
SIGNED = turns(ASK, ("assistant", [thought(), tool_use()]), RESULT)
FORGED = turns(ASK, ("assistant", [thought(signature="forged")]), ("user", "嗯"))
BAD_ID = turns(ASK, ("assistant", [tool_use("call.1")]), ("user", [result("call.1")]))
FIVE_MARKS = [{"type": "text", "text": "规则", "cache_control": {"type": "ephemeral"}}] * 5
ASKED = {"role": "user", "content": "几点了"}
ANSWER = {"role": "tool", "tool_call_id": "call_1", "content": "08:30"}
NO_CONTENT = {"role": "assistant", "content": None}

# rule: (what the body changes, status, a fragment of the error message; None: accepted)
OPENAI_RULES = {
    "effort, no reasoning": (
        {"reasoning_effort": "low"},
        400,
        "'reasoning_effort' is not supported",
    ),
    "effort, reasoning": ({"model": "o4-mini", "reasoning_effort": "low"}, 200, None),
    "unknown model": ({"model": "gpt-9"}, 404, "does not exist"),
    "stream_options alone": ({"stream_options": {"include_usage": True}}, 400, "only allowed when"),
    "no messages": ({"messages": []}, 400, "empty array"),
    "a tool round": ({"messages": [ASKED, openai_call(), ANSWER]}, 200, None),
    "unanswered": (
        {"messages": [ASKED, openai_call()]},
        400,
        "did not have response messages: call_1",
    ),
    "orphan result": ({"messages": [ASKED, ANSWER]}, 400, "must be a response to a preceeding"),
    "wrong result": (
        {"messages": [ASKED, openai_call("call_9"), ANSWER]},
        400,
        "'call_1' not found",
    ),
    "long id": ({"messages": [ASKED, openai_call("c" * 41)]}, 400, "maximum length 40"),
    "no content": ({"messages": [ASKED, NO_CONTENT]}, 400, "got null"),
    "empty user text": ({"messages": [{"role": "user", "content": ""}]}, 200, None),
}
ANTHROPIC_RULES = {
    "system role": ({"messages": turns(("system", "规则"), ASK)}, 400, "Input should be 'user'"),
    "same role twice": ({"messages": turns(ASK, ("user", "在吗"))}, 200, None),
    "assistant first": ({"messages": turns(("assistant", "早"), ASK)}, 200, None),
    "empty content": ({"messages": turns(("user", ""))}, 400, "must have non-empty content"),
    "empty text": ({"messages": turns(("user", [{**TEXT, "text": ""}]))}, 400, "must be non-empty"),
    "blank text": ({"messages": turns(("user", "  \n"))}, 400, "non-whitespace text"),
    "a tool round": ({"messages": ROUND}, 200, None),
    "unanswered": ({"messages": ROUND[:2]}, 400, "without `tool_result` blocks immediately after"),
    "orphan result": ({"messages": turns(ASK, ("assistant", "好"), RESULT)}, 400, "unexpected"),
    "text first": ({"messages": [*ROUND[:2], *turns(("user", [TEXT, result()]))]}, 400, "after"),
    "repeated id": ({"messages": [*ROUND, *turns(USE, RESULT)]}, 400, "ids must be unique"),
    "bad id": ({"messages": BAD_ID}, 400, "String should match pattern"),
    "five breakpoints": ({"system": FIVE_MARKS}, 400, "A maximum of 4 blocks with cache_control"),
    "thinking on 3.5 haiku": (
        {"model": "claude-3-5-haiku-latest", "thinking": THINKING},
        400,
        "does not support thinking",
    ),
    "small budget": ({"thinking": {**THINKING, "budget_tokens": 512}}, 400, "or equal to 1024"),
    "budget over max": ({"thinking": THINKING, "max_tokens": 2048}, 400, "must be greater than"),
    "thinking, no block": ({"thinking": THINKING, "messages": ROUND}, 400, "but found `tool_use`"),
    "thinking, signed": ({"thinking": THINKING, "messages": SIGNED}, 200, None),
    "thinking, new turn": (
        {"thinking": THINKING, "messages": [*ROUND, *turns(("assistant", "八点半"), ASK)]},
        200,
        None,
    ),
    "forged signature": ({"messages": FORGED}, 400, "Invalid `signature`"),
    "unknown model": ({"model": "claude-9"}, 404, "model: claude-9"),
}
BASES = {"openai": OPENAI, "anthropic": ANTHROPIC}


def cases(provider: str, rules: dict[str, tuple[Any, ...]]) -> list[Any]:
    return [pytest.param(provider, *case, id=f"{provider}: {name}") for name, case in rules.items()]


@pytest.mark.parametrize(
    ("provider", "change", "status", "fragment"),
    cases("openai", OPENAI_RULES) + cases("anthropic", ANTHROPIC_RULES),
)
def test_each_rule_is_enforced_with_the_providers_error(
    emulator, provider, change, status, fragment
):
    response = post(emulator, provider, {**BASES[provider], **change})
    assert response.status_code == status, response.text
    if fragment is None:
        return
    if provider == "openai":
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    else:
        body = response.json()
        assert body["type"] == "error" and response.headers["x-should-retry"] == "false"
        error = body["error"]
    assert fragment in error["message"]
    assert error["type"] == ("invalid_request_error" if status == 400 else error["type"])


def test_anthropic_headers_and_max_tokens_are_required(emulator):
    assert (
        "anthropic-version"
        in post(emulator, "anthropic", ANTHROPIC, **{"anthropic-version": ""}).text
    )
    no_limit = {k: v for k, v in ANTHROPIC.items() if k != "max_tokens"}
    assert "max_tokens: Field required" in post(emulator, "anthropic", no_limit).text


def test_the_token_counter_counts_without_a_reply_or_a_cache_write(emulator):
    body = {k: v for k, v in ANTHROPIC.items() if k != "max_tokens"}
    sent = httpx.post(
        emulator.url + "/v1/messages/count_tokens", json=body, headers=HEADERS["anthropic"]
    )
    assert sent.json()["input_tokens"] > 0 and emulator.script.pending == 0
    assert not emulator.anthropic.cache.entries


def test_tokens_are_a_cjk_character_or_four_other_characters():
    assert count("你好，世界") == 5
    assert count("abcdefgh") == 2 and count("abcdefghi") == 3


def long_text(tokens: int, seed: str = "甲") -> str:
    return seed * tokens


def openai_usage(api: Emulator, content: str, model: str = "gpt-4o-mini") -> tuple[int, int]:
    """(prompt tokens, cached tokens) of a one-message request."""
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    usage = post(api, "openai", body).json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def test_openai_caches_the_longest_seen_prefix_in_128_token_steps(emulator):
    prompt = long_text(3000)
    total, first = openai_usage(emulator, prompt)
    _, again = openai_usage(emulator, prompt + "乙" * 50)
    assert first == 0 and again % 128 == 0 and total - 128 < again <= total
    openai_usage(emulator, long_text(900))
    assert openai_usage(emulator, long_text(900))[1] == 0, "under 1,024 tokens nothing is cached"
    assert openai_usage(emulator, prompt, "gpt-4o")[1] == 0, "caches are per model"


def marked(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def anthropic_usage(api: Emulator, body: dict[str, Any]) -> dict[str, Any]:
    response = post(api, "anthropic", {**ANTHROPIC, **body})
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_anthropic_caches_up_to_a_breakpoint_and_input_tokens_exclude_the_cache(emulator):
    system = {"system": marked(long_text(1500))}
    first = anthropic_usage(emulator, system)
    second = anthropic_usage(emulator, {**system, "messages": turns(("user", "另一个问题"))})
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 1500
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == 0
    total = count(json.dumps(["user", {"type": "text", "text": "另一个问题"}], ensure_ascii=False))
    assert second["input_tokens"] <= total + 10, (
        "only the part after the breakpoint is paid in full"
    )
    unmarked = anthropic_usage(emulator, {"system": long_text(1500)})
    assert unmarked["cache_read_input_tokens"] == unmarked["cache_creation_input_tokens"] == 0


def test_anthropic_needs_the_models_minimum_and_a_breakpoint_within_twenty_blocks(emulator):
    assert (
        anthropic_usage(emulator, {"system": marked(long_text(800))})["cache_creation_input_tokens"]
        == 0
    )
    haiku = {"model": "claude-3-5-haiku-latest", "system": marked(long_text(1500))}
    assert anthropic_usage(emulator, haiku)["cache_creation_input_tokens"] == 0, "Haiku: 2,048"
    chat = turns(*[("user" if i % 2 == 0 else "assistant", f"第{i}条") for i in range(30)])
    base = {"system": long_text(1500)}
    anthropic_usage(emulator, {**base, "messages": [*chat[:5], *turns(("user", marked("标记")))]})
    late = [*chat[:5], *turns(("user", "标记")), *chat[6:], *turns(("user", marked("末尾")))]
    assert anthropic_usage(emulator, {**base, "messages": late})["cache_read_input_tokens"] == 0
    near = [*chat[:5], *turns(("user", "标记")), *chat[6:12], *turns(("user", marked("末尾")))]
    assert anthropic_usage(emulator, {**base, "messages": near})["cache_read_input_tokens"] > 1500


def raw_stream(api: Emulator, provider: str, body: dict[str, Any]) -> list[str]:
    """The data lines of a streamed answer."""
    stream = {**body, "stream": True}
    lines = post(api, provider, stream).text.splitlines()
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def test_injected_statuses_come_in_each_providers_shape(emulator):
    emulator.inject(Status(429), times=2)
    limited = post(emulator, "openai", OPENAI)
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert limited.headers["retry-after-ms"] == "5"
    overloaded = post(emulator, "anthropic", ANTHROPIC)
    assert (
        overloaded.status_code == 429 and overloaded.json()["error"]["type"] == "rate_limit_error"
    )
    emulator.inject(Status(529))
    assert post(emulator, "anthropic", ANTHROPIC).json()["error"]["type"] == "overloaded_error"
    assert post(emulator, "anthropic", ANTHROPIC).status_code == 200, "the faults are spent"
    assert [r.fault for r in emulator.requests] == ["Status", "Status", "Status", None]


def test_a_dropped_connection_an_html_page_and_a_hang(emulator):
    emulator.inject(Drop())
    with pytest.raises(httpx.RemoteProtocolError):
        post(emulator, "openai", OPENAI)
    emulator.inject(Html())
    page = post(emulator, "openai", OPENAI)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    emulator.inject(Hang(5))
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            emulator.url + PATHS["openai"], json=OPENAI, headers=HEADERS["openai"], timeout=0.2
        )
    assert time.monotonic() - started < 1 and post(emulator, "openai", OPENAI).status_code == 200
    assert len(emulator.requests) == 4, "every request is counted, the dropped one too"


def test_stream_faults_wait_for_a_stream_and_cut_it(emulator):
    emulator.inject(CutStream())
    assert (
        post(emulator, "openai", OPENAI).status_code == 200 and emulator.requests[-1].fault is None
    )
    cut = raw_stream(emulator, "openai", OPENAI)
    assert "[DONE]" not in cut and all(
        json.loads(d)["choices"][0]["finish_reason"] is None for d in cut
    )
    emulator.inject(CutStream())
    events = raw_stream(emulator, "anthropic", ANTHROPIC)
    assert [json.loads(d)["type"] for d in events][-1] == "content_block_stop"
    emulator.reply(call("get_time"))
    emulator.inject(CutAfterToolName())
    last = json.loads(raw_stream(emulator, "openai", OPENAI)[-1])["choices"][0]["delta"]
    assert last["tool_calls"][0]["function"] == {"name": "get_time", "arguments": ""}


def test_a_bad_sse_line_is_one_broken_event_in_a_complete_stream(emulator):
    emulator.inject(BadSseLine(), when=lambda request: request.provider == "anthropic")
    assert "[DONE]" in raw_stream(emulator, "openai", OPENAI)
    events = raw_stream(emulator, "anthropic", ANTHROPIC)
    broken = []
    for data in events:
        try:
            json.loads(data)
        except ValueError:
            broken.append(data)
    assert len(broken) == 1 and json.loads(events[-1])["type"] == "message_stop"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("streaming", [False, True])
def test_the_real_clients_round_trip_text_tool_calls_and_usage(emulator, provider, streaming):
    model = client(emulator, provider, stream_usage=True).bind_tools([add])
    emulator.reply(call("add", a=1, b=2), Reply("一加二等于三。"))

    def ask(messages):
        if not streaming:
            return model.invoke(messages)
        chunks = list(model.stream(messages))
        return sum(chunks[1:], chunks[0])

    first = ask([HumanMessage("一加二是多少？")])
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("add", {"a": 1, "b": 2})]
    answer = ToolMessage("3", tool_call_id=first.tool_calls[0]["id"])
    asked = AIMessage(first.content, tool_calls=first.tool_calls)
    second = ask([HumanMessage("一加二是多少？"), asked, answer])
    assert second.text == "一加二等于三。"
    sent = emulator.generations()
    assert [r.status for r in sent] == [200, 200] and all(r.stream == streaming for r in sent)
    reported = sent[-1].usage or {}
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    prompt = reported.get("prompt_tokens") or sum(reported[k] for k in parts)
    assert second.usage_metadata["input_tokens"] == prompt
    assert traffic_problems(emulator.requests) == {}


def test_anthropic_thinking_comes_back_signed_and_continues_the_tool_round(emulator):
    model = anthropic_model(emulator, thinking=THINKING).bind_tools([add])
    emulator.reply(Reply(calls=call("add", a=2, b=2).calls, thinking="先算一下"), Reply("四。"))
    first = model.invoke("二加二？")
    assert first.content[0]["type"] == "thinking"
    model.invoke(["二加二？", first, ToolMessage("4", tool_call_id=first.tool_calls[0]["id"])])
    assert [r.status for r in emulator.generations()] == [200, 200]


def test_chat_openai_streams_usage_only_when_asked(emulator):
    chunks = list(openai_model(emulator).stream("你好"))
    assert sum(chunks[1:], chunks[0]).usage_metadata is None
    assert "stream_options" not in emulator.requests[-1].payload, "a custom base URL turns it off"
