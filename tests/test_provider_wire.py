"""The loop on the wire: the real `ChatOpenAI` / `ChatAnthropic` clients, over HTTP, against
the provider emulator (`tests/emulator`), which refuses what the APIs refuse (issue 32).

Plain tests pin what holds today. Each finding of issue 32 that still fails
has a strict xfail test stating the behaviour the fix must bring, so it flips
(and must lose its mark) once fixed.
"""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from graph import (
    Compaction,
    Fallbacks,
    LoopConfig,
    ModelView,
    Persona,
    SessionEnv,
    Trusted,
    build_graph,
    open_checkpointer,
)
from tests.conftest import make_config, thread
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
from tests.emulator.cache_share import GROUP, OWNER, Chat, measure
from tests.emulator.fixtures import (  # noqa: F401
    anthropic_model,
    client,
    emulator,
    offline_tokenizer,
    openai_model,
    provider_env,
)
from tests.emulator.traffic import traffic_problems

PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
FAST_RETRY = {"initial_interval": 0.01, "max_interval": 0.02, "jitter": False}
"""The default 3 attempts, without the waits."""
QUICKSTART = {
    "xilian": Persona(name="昔涟", instructions="你是昔涟，温柔、好奇。", reasoning_effort="low"),
    "aglaea": Persona(
        name="阿格莱雅",
        instructions="你是阿格莱雅，沉静、克制。",
        thinking_budget=2048,
        show_thinking=False,
    ),
}
THINKING = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", thinking_budget=2048)}
GROUP_ENV = SessionEnv(actor="group")
OWNER_ENV = SessionEnv(actor="owner", persona_id="xilian")
IMPORTED = [
    HumanMessage("现在几点？"),
    AIMessage("", tool_calls=[{"name": "get_time", "args": {}, "id": "call_1"}]),
    ToolMessage("08:30", tool_call_id="call_1"),
    AIMessage("八点半了。"),
    SystemMessage("主人今天过生日"),
    HumanMessage("早"),
]
"""The imported history of docs/what-a-run-accepts.md, verbatim."""


def quickstart(model: str) -> LoopConfig:
    """The README quickstart's personas on `model` (a "provider:model" string)."""
    return LoopConfig(model=model, personas=QUICKSTART, default_persona="xilian", retry=FAST_RETRY)


def wire_graph(model: Any, saver: Any, **overrides: Any) -> Any:
    """The loop on `model` with fast retries (and `overrides`), saving to `saver`."""
    return build_graph(make_config(model, retry=FAST_RETRY, **overrides), saver)


def say(
    graph: Any,
    text: str,
    thread_id: str,
    env: SessionEnv | None = None,
    stream: bool = False,
    name: str | None = None,
) -> dict[str, Any]:
    """One turn (streamed as `stream_mode="messages"` when `stream`); the state after it."""
    inputs, config = {"messages": [HumanMessage(text, name=name)]}, thread(thread_id)
    if not stream:
        return graph.invoke(inputs, config, context=env)
    for _ in graph.stream(inputs, config, context=env, stream_mode="messages"):
        pass
    return graph.get_state(config).values


def refused(api: Emulator) -> list[str]:
    """The reply requests an API rule refused, as their error messages."""
    return [str(r.error) for r in api.rejected() if r.generates]


# -- what holds --------------------------------------------------------------


@PROVIDERS
@pytest.mark.parametrize("layout", ["round_first", "cache"])
@pytest.mark.parametrize("stream", [False, True])
def test_owner_and_group_chats_send_only_requests_the_api_accepts(
    emulator, provider, layout, stream
):
    emulator.reply(
        Reply("早安。"), call("get_time"), Reply("八点半。"), Reply("大家好。"), Reply("好的。")
    )
    with open_checkpointer("memory") as saver:
        graph = wire_graph(
            client(emulator, provider),
            saver,
            restricted_tools={"get_time"},
            features=[ModelView(layout=layout)],
        )
        say(graph, "早", "owner", stream=stream)
        assert say(graph, "几点了", "owner", stream=stream)["messages"][-1].text == "八点半。"
        say(graph, "大家好", "group", GROUP_ENV, stream, name="小明")
        say(graph, "你好", "group", GROUP_ENV, stream)
    assert len(emulator.generations()) == 5 and refused(emulator) == []
    assert traffic_problems(emulator.requests) == {}, "tests/payload_checks.py agrees"


@PROVIDERS
def test_token_usage_is_what_the_server_reported_cache_reads_included(emulator, provider):
    long = Persona(name="昔涟", instructions="你是昔涟，主人的陪伴者。" * 120)
    with open_checkpointer("memory") as saver:
        graph = wire_graph(
            client(emulator, provider),
            saver,
            personas={"xilian": long},
            features=[ModelView(layout="cache")],
        )
        say(graph, "早", "u")
        say(graph, "今天天气不错", "u")  # the first labelled reply brings the role declaration
        usage = say(graph, "出去走走吧", "u")["token_usage"]["turn"]
    reported = emulator.generations()[-1].usage or {}
    if provider == "openai":
        read, total = reported["prompt_tokens_details"]["cached_tokens"], reported["prompt_tokens"]
    else:
        read = reported["cache_read_input_tokens"]
        total = read + reported["cache_creation_input_tokens"] + reported["input_tokens"]
    assert read > 0 and usage["input_tokens"] == total
    assert usage["input_token_details"]["cache_read"] == read


@PROVIDERS
@pytest.mark.parametrize("fault", [Status(429), Status(500), Drop()], ids=["429", "500", "drop"])
def test_one_transient_failure_recovers_and_keeps_the_message_once(emulator, provider, fault):
    emulator.inject(fault)
    with open_checkpointer("memory") as saver:
        messages = say(wire_graph(client(emulator, provider), saver), "你好", "t")["messages"]
    assert [m.text for m in messages] == ["你好", "好的。"]
    assert len(emulator.generations()) == 2


def test_reasoning_effort_reaches_a_reasoning_model(provider_env):
    with open_checkpointer("memory") as saver:
        say(build_graph(quickstart("openai:o4-mini"), saver), "早安", "r")
    assert provider_env.generations()[-1].payload["reasoning_effort"] == "low"
    assert refused(provider_env) == []


def test_a_time_limit_abandons_a_hang_and_the_retry_answers(emulator):
    emulator.inject(Hang(3))
    started = time.monotonic()
    with open_checkpointer("memory") as saver:
        reply = say(wire_graph(openai_model(emulator), saver, model_timeout=0.3), "在吗", "h")
    assert reply["messages"][-1].text == "好的。" and time.monotonic() - started < 2
    assert len(emulator.generations()) == 2


def test_anthropic_cache_layout_reads_the_cache_in_an_owner_chat(tmp_path):
    share = measure("anthropic", "cache", Chat("owner", 12, (None,)), tmp_path, budget=0)
    assert share.share >= 0.8


# -- issue 32's findings, failing today ----------------------------------------


def xfail(finding: int, why: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"issue 32 finding {finding}: {why}")


def test_the_quickstart_personas_answer_on_gpt_4o_mini(provider_env):
    with open_checkpointer("memory") as saver:
        graph = build_graph(quickstart("openai:gpt-4o-mini"), saver)
        for text in ("早安", "今天做什么", "晚安"):
            assert say(graph, text, "q", OWNER_ENV)["messages"][-1].text
    assert refused(provider_env) == []


def test_a_request_the_api_refuses_is_not_promised_a_resume(provider_env):
    forced = QUICKSTART["xilian"].model_copy(update={"model_accepts_thinking": True})
    config = quickstart("openai:gpt-4o-mini").model_copy(update={"personas": {"xilian": forced}})
    with open_checkpointer("memory") as saver, pytest.raises(Exception) as raised:
        say(build_graph(config, saver), "早安", "q", OWNER_ENV)  # 400 unsupported_parameter
    assert not any("resumes it" in note for note in getattr(raised.value, "__notes__", []))


def test_a_history_imported_twice_keeps_answering_on_anthropic(emulator):
    with open_checkpointer("memory") as saver:
        graph = wire_graph(anthropic_model(emulator), saver)
        graph.invoke(Trusted({"messages": IMPORTED}), thread("imported"))
        graph.invoke(Trusted({"messages": IMPORTED}), thread("imported"))
        assert say(graph, "在吗", "imported")["messages"][-1].text == "好的。"
    assert refused(emulator) == [] and traffic_problems(emulator.requests) == {}


REACHED = {
    ("openai", "owner"): 0.86,
    ("openai", "group"): 0.84,
    ("anthropic", "owner"): 0.88,
    ("anthropic", "group"): 0.85,
}
"""The cached share each cell of docs/providers.md's table reaches, less about 0.01: runs on a
loaded machine read up to 0.015 less. (0.85 to 0.89 before compaction cut back to a low-water
mark and the round-state block's opening line was cut, 0.86 to 0.90 after.)"""


@PROVIDERS
@pytest.mark.parametrize("chat", [OWNER, GROUP], ids=["owner", "group"])
def test_the_cache_layout_reads_most_of_every_chat_compaction_included(tmp_path, provider, chat):
    """docs/providers.md's table: switches, tools, a moving clock and a compaction. Issue 32's
    0.95 is not reached: `python -m tests.emulator.cache_breakdown` says where the rest goes
    (the round's own blocks ~5 %, the new turn 2.5-4 %, the compaction 2-4.5 %, OpenAI's
    128-token steps ~1.7 %)."""
    share = measure(provider, "cache", chat, tmp_path)
    assert share.compactions >= 1 and share.share >= REACHED[provider, chat.name]


def test_a_compaction_leaves_room_for_many_rounds_at_a_small_budget(tmp_path):
    """The view is cut back well below the budget, every persona's instructions included, so
    the next compaction is rounds away; each one changes everything after the cached lead. (It
    fired every turn.) On Anthropic at 3,000 it still does: the structural summary measures ~4
    characters a token, and in Claude's tokens its CJK text passes its bound several times."""
    turns = measure("openai", "cache", OWNER, tmp_path, budget=1000).compacted_at
    assert len(turns) >= 2 and min(b - a for a, b in pairwise(turns)) >= 3


def test_anthropic_cache_layout_reads_the_cache_in_a_group_chat(tmp_path):
    assert measure("anthropic", "cache", GROUP, tmp_path, budget=0).share >= 0.8


@PROVIDERS
def test_a_persona_switch_still_reads_the_cache(tmp_path, provider):
    switching = Chat("owner", 8, (None,), ((6, "aglaea"),))
    shares = measure(provider, "cache", switching, tmp_path, budget=0).per_turn
    assert shares[5] > 0.5 and shares[6] > 0.8, "the switch changes only the round's own blocks"


@PROVIDERS
def test_the_request_after_a_compaction_reads_the_cached_lead(tmp_path, provider):
    share = measure(provider, "cache", OWNER, tmp_path)
    assert share.compactions >= 1
    after = [share.per_turn[turn] for turn in share.compacted_at]
    assert min(after) > 0.25, "the lead (every persona, the rules of the notes) was cached"


def test_a_thinking_fallback_continues_an_openai_tool_round(emulator):
    emulator.reply(call("get_time"), Reply("八点半了。"))
    emulator.inject(Status(500), times=None, when=lambda r: r.provider == "openai" and r.number > 1)
    with open_checkpointer("memory") as saver:
        graph = wire_graph(
            openai_model(emulator),
            saver,
            personas=THINKING,
            features=[Fallbacks(models=[anthropic_model(emulator)])],
        )
        assert say(graph, "几点了", "f")["messages"][-1].text == "八点半了。"


def test_a_tool_round_begun_with_thinking_goes_on_thinking(emulator):
    emulator.reply(call("get_time"), Reply("八点半了。"))
    with open_checkpointer("memory") as saver:
        graph = wire_graph(anthropic_model(emulator), saver, personas=THINKING)
        assert say(graph, "几点了", "t")["messages"][-1].text == "八点半了。"
    sent = [request.payload.get("thinking") for request in emulator.generations()]
    assert sent == [{"type": "enabled", "budget_tokens": 2048}] * 2


def test_a_thinking_persona_resumes_a_tool_round_begun_on_openai(emulator):
    emulator.reply(call("get_time"))
    emulator.inject(Status(500), times=None, when=lambda r: r.provider == "openai" and r.number > 1)
    with open_checkpointer("memory") as saver:
        with pytest.raises(Exception, match="500"):
            say(wire_graph(openai_model(emulator), saver, personas=THINKING), "几点了", "r")
        emulator.reply(Reply("八点半了。"))
        thinking = wire_graph(anthropic_model(emulator), saver, personas=THINKING)
        resumed = thinking.invoke(None, thread("r"))
    assert resumed["messages"][-1].text == "八点半了。"


def test_streamed_openai_turns_count_their_tokens(emulator):
    with open_checkpointer("memory") as saver:
        values = say(wire_graph(openai_model(emulator), saver), "你好", "s", stream=True)
    counted = (values.get("token_usage") or {}).get("turn") or {}
    assert counted.get("input_tokens") == (emulator.generations()[-1].usage or {})["prompt_tokens"]


@PROVIDERS
def test_a_cut_off_stream_is_not_stored_as_the_reply(emulator, provider):
    emulator.reply(Reply("这是被截断的回"), Reply("这是完整的回答。"))
    emulator.inject(CutStream())
    with open_checkpointer("memory") as saver:
        values = say(wire_graph(client(emulator, provider), saver), "你好", "c", stream=True)
    assert values["messages"][-1].text == "这是完整的回答。"


def test_a_cut_off_stream_behind_the_thinking_gate_is_not_stored_either(emulator):
    hidden = Persona(
        name="昔涟", instructions="你是昔涟。", thinking_budget=2048, show_thinking=False
    )
    emulator.reply(Reply("这是被截断的回"), Reply("这是完整的回答。"))
    emulator.inject(CutStream())
    with open_checkpointer("memory") as saver:
        graph = wire_graph(anthropic_model(emulator), saver, personas={"xilian": hidden})
        values = say(graph, "你好", "g", stream=True)
    assert [m.text for m in values["messages"]] == ["你好", "这是完整的回答。"]


@PROVIDERS
def test_a_stream_cut_after_a_tool_name_never_runs_the_tool(emulator, provider):
    notes: list[str] = []

    @tool
    def note(text: str = "") -> str:
        """Write a note."""
        notes.append(text)
        return "记下了"

    emulator.reply(call("note", text="牛奶"), call("note", text="牛奶"), Reply("记下了。"))
    emulator.inject(CutAfterToolName())
    with open_checkpointer("memory") as saver:
        graph = wire_graph(client(emulator, provider), saver, tools=[note])
        say(graph, "记一下买牛奶", "n", stream=True)
    assert notes == ["牛奶"]


@PROVIDERS
def test_a_persistent_500_costs_the_configured_attempts(emulator, provider):
    emulator.inject(Status(500), times=None)
    with open_checkpointer("memory") as saver, pytest.raises(Exception, match="500"):
        say(wire_graph(client(emulator, provider), saver), "你好", "p")
    assert len(emulator.generations()) == 3


def test_one_attempt_is_one_request(emulator):
    emulator.inject(Status(429), times=None)
    config = make_config(openai_model(emulator), retry={"max_attempts": 1})
    with open_checkpointer("memory") as saver, pytest.raises(Exception, match="429"):
        say(build_graph(config, saver), "你好", "p")
    assert len(emulator.generations()) == 1


@PROVIDERS
@pytest.mark.parametrize("fault", [Html(), BadSseLine()], ids=["html-200", "bad-sse-line"])
def test_a_malformed_200_is_retried(emulator, provider, fault):
    emulator.inject(fault)
    with open_checkpointer("memory") as saver:
        graph = wire_graph(client(emulator, provider), saver)
        values = say(graph, "你好", "m", stream=fault.streams_only)
    assert values["messages"][-1].text == "好的。"


def test_a_hanging_provider_has_a_default_time_limit(emulator):
    model = openai_model(emulator)
    sdk = model.root_client._client.timeout  # LangChain passes timeout=None: none at all
    limit = LoopConfig(model=model).model_timeout
    assert limit is not None and limit <= 120, f"model_timeout={limit}, SDK read timeout={sdk.read}"


def test_compaction_on_anthropic_sends_no_refused_token_counts(emulator):
    emulator.respond_with(lambda request: Reply("好的，我记住了。" * 10))
    with open_checkpointer("memory") as saver:
        graph = wire_graph(
            anthropic_model(emulator), saver, features=[Compaction(max_context_tokens=300)]
        )
        for text in ("早", "今天去了公园", "看到了很多花", "还喂了鸽子"):
            say(graph, text, "k")
    counts = [r for r in emulator.requests if not r.generates]
    assert counts and [r.error for r in counts if not r.accepted] == []
