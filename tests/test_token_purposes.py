"""Issue 32: every model call the loop makes is counted, by purpose, as the provider reported
it: a reply judge's, a compactor's and an extractor's beside the replies', over the wire (the
real `ChatOpenAI` / `ChatAnthropic` against the emulator). Before, only the replies were: a
5-turn run with `LLMExtractor` left 3,622 of 4,846 input tokens uncounted."""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents.middleware import LLMToolSelectorMiddleware
from langchain.agents.middleware.tool_selection import DEFAULT_SYSTEM_PROMPT as SELECTOR_PROMPT
from langchain_core.messages import HumanMessage

from graph import (
    Compaction,
    GroupPresence,
    LLMCompactor,
    LLMExtractor,
    LLMReplyJudge,
    ModelView,
    Persona,
    SessionEnv,
    Vision,
    build_graph,
    open_checkpointer,
    wait_for_extractions,
)
from memory import HashingEmbedding, MemoryStore
from nodes.compaction.summary import COMPACTION_PROMPT
from nodes.extraction.extractors import OPERATIONS_PROMPT
from nodes.presence.judges import JUDGE_INSTRUCTIONS
from studio.demo.conversation import SUNSET_PNG
from tests.cli_support import cyrene
from tests.conftest import make_config, thread
from tests.emulator import Emulator, Reply
from tests.emulator.fixtures import (  # noqa: F401
    anthropic_model,
    client,
    emulator,
    offline_tokenizer,
    openai_model,
)
from tests.emulator.script import Call
from tests.emulator.wire import Request

PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
DESCRIBER = "gpt-4o"
"""The vision model that describes images (the replies come from another)."""
GROUP = SessionEnv(actor="group")


def system_text(request: Request) -> str:
    """The request's system prompt, in either API's shape."""
    system = request.payload.get("system")
    if request.provider == "openai":
        system = [m.get("content") for m in request.messages if m.get("role") == "system"]
    return str(system)


def structured(request: Request, name: str, args: dict[str, Any]) -> Reply:
    """A structured answer as each provider's client asks for it: JSON text (OpenAI's
    `response_format`), a forced tool call (Anthropic)."""
    if request.provider == "openai":
        import json

        return Reply(json.dumps(args, ensure_ascii=False))
    return Reply(calls=(Call(name, args),))


def responder(request: Request) -> Reply:
    """Each purpose's answer, told apart by its instructions (or model); anything else is a
    reply."""
    system = system_text(request)
    if request.model == DESCRIBER:
        return Reply("一张海边日落的照片。")
    if SELECTOR_PROMPT[:12] in system:
        return structured(request, "ToolSelectionResponse", {"tools": ["get_time"]})
    if JUDGE_INSTRUCTIONS[:12] in system:
        return structured(request, "Decision", {"reply": True, "reason": "有人提问"})
    if COMPACTION_PROMPT[:12] in system:
        return Reply("主人和昔涟聊了天气。")
    if OPERATIONS_PROMPT[:12] in system:
        memory = {"op": "add", "content": "主人喜欢乌龙茶", "kind": "habit", "scope": "user"}
        return structured(request, "MemoryOperations", {"operations": [memory]})
    return Reply("好的。")


def input_and_output(request: Request) -> tuple[int, int]:
    """(input, output) tokens as LangChain counts them from the provider's report: Anthropic's
    input is its uncached, cache-read and cache-written tokens together."""
    usage = request.usage or {}
    if request.provider == "openai":
        return usage["prompt_tokens"], usage["completion_tokens"]
    cached = usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    return usage["input_tokens"] + cached, usage["output_tokens"]


def reported(api: Emulator, purpose: Callable[[Request], bool]) -> tuple[int, int]:
    """The server's (input, output) sums over the answered requests of one purpose."""
    pairs = [input_and_output(r) for r in api.generations() if r.accepted and purpose(r)]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def asked(prompt: str) -> Callable[[Request], bool]:
    return lambda request: prompt[:12] in system_text(request)


def is_reply(request: Request) -> bool:
    return request.model != DESCRIBER and not any(
        asked(prompt)(request)
        for prompt in (JUDGE_INSTRUCTIONS, COMPACTION_PROMPT, OPERATIONS_PROMPT, SELECTOR_PROMPT)
    )


def counted(usage: dict[str, Any], purpose: str) -> tuple[int, int]:
    kept = usage["purposes"][purpose]
    return kept["input_tokens"], kept["output_tokens"]


@PROVIDERS
def test_a_reply_judges_tokens_count_as_presence(emulator, provider):
    emulator.respond_with(responder)
    model = client(emulator, provider)
    judged = GroupPresence(reply="judged", judge=LLMReplyJudge(client(emulator, provider)))
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, retry=None, features=[judged]), saver)
        for text in ("今天谁有空？", "有人去爬山吗？"):
            out = graph.invoke(
                {"messages": [HumanMessage(text, name="小明")]}, thread("g"), context=GROUP
            )
    usage = out["token_usage"]
    assert counted(usage, "presence") == reported(emulator, asked(JUDGE_INSTRUCTIONS))
    assert usage["turn"]["input_tokens"] == input_and_output(emulator.generations()[-1])[0]
    assert (usage["session"]["input_tokens"], usage["session"]["output_tokens"]) == reported(
        emulator, lambda request: True
    ), "the session's total is every call's"


@PROVIDERS
def test_a_compactors_tokens_count_as_compaction(emulator, provider):
    emulator.respond_with(responder)
    model = client(emulator, provider)
    compaction = Compaction(
        max_context_tokens=200, compactor=LLMCompactor(client(emulator, provider))
    )
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, retry=None, features=[compaction]), saver)
        for n in range(8):
            text = f"第{n}句：今天的天气很好，我们出去走走吧。" * 6
            out = graph.invoke({"messages": [HumanMessage(text)]}, thread("c"))
    assert reported(emulator, asked(COMPACTION_PROMPT))[0] > 0, "compaction fired"
    assert counted(out["token_usage"], "compaction") == reported(emulator, asked(COMPACTION_PROMPT))
    replies = reported(emulator, is_reply)
    session = out["token_usage"]["session"]
    assert session["input_tokens"] - counted(out["token_usage"], "compaction")[0] == replies[0]


@PROVIDERS
@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_an_extractors_tokens_count_as_extraction(emulator, provider, background, tmp_path):
    emulator.respond_with(responder)
    model = client(emulator, provider)
    with (
        MemoryStore.open(tmp_path / "mem", embedding_function=HashingEmbedding()) as store,
        open_checkpointer("memory") as saver,
    ):
        extractor = LLMExtractor(client(emulator, provider), background=background)
        graph = build_graph(
            make_config(model, retry=None, memory=store, extractor=extractor), saver
        )
        graph.invoke({"messages": [HumanMessage("我喜欢乌龙茶")]}, thread("e"))
        assert wait_for_extractions(30)
        # A background extraction's tokens are taken into the session at its next turn.
        out = graph.invoke({"messages": [HumanMessage("晚安")]}, thread("e"))
        assert wait_for_extractions(30)
        assert [m.content for m in store.list()] == ["主人喜欢乌龙茶"]
    extraction = asked(OPERATIONS_PROMPT)
    extractions = [r for r in emulator.generations() if extraction(r)]
    first = input_and_output(extractions[0])
    if background:
        assert counted(out["token_usage"], "extraction") == first, "the first turn's, taken now"
    else:
        assert counted(out["token_usage"], "extraction") == reported(emulator, extraction)


def test_a_describer_models_tokens_count_as_vision(emulator):
    emulator.respond_with(responder)
    describer = Vision(
        describer=openai_model(emulator, model=DESCRIBER), model_accepts_images=False
    )
    photo = [
        {"type": "text", "text": "看看这张照片。"},
        {"type": "image", "base64": SUNSET_PNG, "mime_type": "image/png"},
    ]
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(openai_model(emulator), retry=None, features=[describer]), saver
        )
        out = graph.invoke({"messages": [HumanMessage(photo)]}, thread("v"))
    assert counted(out["token_usage"], "vision") == reported(
        emulator, lambda request: request.model == DESCRIBER
    )


@PROVIDERS
@pytest.mark.parametrize("run", ["sync", "async"])
async def test_a_middlewares_own_calls_count_as_middleware(emulator, provider, run):
    """LLMToolSelectorMiddleware asks a model which tools to offer, inside its wrap_model_call:
    that call is the middleware's, and the reply it hands on to is counted as a reply, once."""
    emulator.respond_with(responder)
    selector = LLMToolSelectorMiddleware(model=client(emulator, provider), max_tools=1)
    with open_checkpointer("memory") as saver:
        config = make_config(client(emulator, provider), retry=None, middleware=[selector])
        graph, turn = build_graph(config, saver), {"messages": [HumanMessage("几点了？")]}
        out = (
            graph.invoke(turn, thread("m"))
            if run == "sync"
            else await graph.ainvoke(turn, thread("m"))
        )
    assert counted(out["token_usage"], "middleware") == reported(emulator, asked(SELECTOR_PROMPT))
    session = out["token_usage"]["session"]
    assert (session["input_tokens"], session["output_tokens"]) == reported(
        emulator, lambda request: True
    ), "each call counted once"


def test_cyrene_history_shows_cache_writes_and_each_purpose(emulator, tmp_path, capsys):
    """An Anthropic session's cache writes (billed at 1.25×) and its judge's tokens reach
    `cyrene history`, as the provider reported them. Before: writes always 0 (langchain-anthropic
    reports them as `ephemeral_5m_input_tokens` with `cache_creation` 0), no purposes."""
    emulator.respond_with(responder)
    long = Persona(name="昔涟", instructions="你是昔涟，主人的陪伴者。" * 120)
    judged = GroupPresence(reply="judged", judge=LLMReplyJudge(anthropic_model(emulator)))
    config = make_config(
        anthropic_model(emulator),
        personas={"xilian": long},
        retry=None,
        timezone="Asia/Shanghai",
        features=[ModelView(layout="cache"), judged],
    )
    url = f"sqlite:///{tmp_path / 'checkpoints.db'}"
    with open_checkpointer(url) as saver:
        graph = build_graph(config, saver)
        for text in ("今天谁有空？", "有人去爬山吗？", "周末呢？"):
            graph.invoke(
                {"messages": [HumanMessage(text, name="小明")]}, thread("g"), context=GROUP
            )
    out = cyrene(capsys, "history", "g", "--checkpoint", url, "--data", str(tmp_path)).out
    lines = dict(line.split(maxsplit=1) for line in out.splitlines()[-2:])
    replies = [r for r in emulator.generations() if is_reply(r)]
    written = sum((r.usage or {})["cache_creation_input_tokens"] for r in replies)
    read = sum((r.usage or {})["cache_read_input_tokens"] for r in replies)
    assert written > 0 and f"(cached {read:,}, cache writes {written:,})" in lines["tokens"]
    judge = reported(emulator, asked(JUDGE_INSTRUCTIONS))
    assert lines["presence"].startswith(f"input {judge[0]:,}")
