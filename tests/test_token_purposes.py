"""Issue 32: every model call the loop makes is counted, by purpose, as the provider reported
it: a reply judge's, a compactor's and an extractor's beside the replies', over the wire (the
real `ChatOpenAI` / `ChatAnthropic` against the emulator). Before, only the replies were: a
5-turn run with `LLMExtractor` left 3,622 of 4,846 input tokens uncounted."""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from graph import (
    Compaction,
    GroupPresence,
    LLMCompactor,
    LLMExtractor,
    LLMReplyJudge,
    SessionEnv,
    build_graph,
    open_checkpointer,
    wait_for_extractions,
)
from memory import HashingEmbedding, MemoryStore
from nodes.compaction.summary import COMPACTION_PROMPT
from nodes.extraction.extractors import OPERATIONS_PROMPT
from nodes.presence.judges import JUDGE_INSTRUCTIONS
from tests.cli_support import cyrene
from tests.conftest import make_config, thread
from tests.emulator import Emulator, Reply
from tests.emulator.fixtures import (  # noqa: F401
    client,
    emulator,
    offline_tokenizer,
    provider_env,
)
from tests.emulator.script import Call
from tests.emulator.wire import Request

PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
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
    """Each purpose's answer, told apart by its instructions; anything else is a reply."""
    system = system_text(request)
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
    return not any(
        asked(prompt)(request)
        for prompt in (JUDGE_INSTRUCTIONS, COMPACTION_PROMPT, OPERATIONS_PROMPT)
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


def test_cyrene_history_shows_cache_writes_and_each_purpose(provider_env, tmp_path, capsys):
    """An Anthropic session's cache writes (billed at 1.25×) and the tokens of each purpose
    reach `cyrene history`, as the provider reported them (before: no writes, no purposes)."""
    provider_env.respond_with(responder)
    data = ["--data", str(tmp_path), "--session", "s1", "--model", "anthropic:claude-sonnet-4-5"]
    for text in ("早", "晚安"):
        assert cyrene(capsys, "run", text, *data).code == 0
    lines = cyrene(capsys, "history", "s1", "--data", str(tmp_path)).out.splitlines()
    totals = dict(
        line.split(maxsplit=1) for line in lines if line.split()[0] in ("tokens", "reply")
    )
    replies = [r for r in provider_env.generations() if is_reply(r)]
    written = sum((r.usage or {})["cache_creation_input_tokens"] for r in replies)
    read = sum((r.usage or {})["cache_read_input_tokens"] for r in replies)
    assert f"(cached {read:,}, cache writes {written:,})" in totals["tokens"]
