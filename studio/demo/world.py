"""The demo world shared by the CLI and Studio: two personas, three tools, seeded memories.

Every stage of the loop is switched on, so Studio shows each node at work: a
compaction budget a longer chat reaches, the offline image describer and the
keyword mood hook (`studio.demo.hooks`), the manual extractor. A real model
(`--model`) keeps the personas, tools and memories but not the demo's stand-ins:
it gets its own compaction budget and sees images itself.

Everything lives under one data folder (default `./.cyrene`): the SQLite
checkpoints, the embedded Chroma memory, the audit and capacity logs, notes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool, tool

from graph import (
    CapacityPolicy,
    Compaction,
    Feature,
    LoopConfig,
    ManualExtractor,
    Persona,
    Tier,
    ToolCalls,
    TurnEnd,
    Vision,
)
from graph.sinks import JsonlSink
from memory import MemoryItem, MemoryStore, Scope
from nodes.core.loop import resolve_model
from studio.demo.hooks import demo_mood, describe_image
from studio.demo.model import DemoChatModel
from studio.memory_server import open_store
from studio.settings import DEFAULT_DATA, MODEL_ENV
from studio.text import Reembedding

# Estimated tokens (LangChain's chars/4 estimate, as the demo model has no
# tokenizer). The first turns of a chat stay under it; `cyrene demo` crosses it
# on the owner chat's sixth turn and the group chat's third, a Studio chat of
# short lines on about its ninth.
DEMO_CONTEXT_TOKENS = 256
DEMO_TIMEZONE = "Asia/Shanghai"

PERSONAS = {
    "xilian": Persona(
        name="昔涟",
        instructions="你是昔涟，温柔、好奇，说话轻快，喜欢用比喻。你是主人的陪伴者。",
        reasoning_effort="low",
        nicknames=("小昔", "Cyrene"),
    ),
    "aglaea": Persona(
        name="阿格莱雅",
        instructions="你是阿格莱雅，沉静、克制，说话简洁有分寸。你是主人的陪伴者。",
        thinking_budget=1024,
        show_thinking=False,
    ),
}
SEED_MEMORIES = (
    MemoryItem(content="主人喜欢喝乌龙茶，不加糖", kind="habit", scope=Scope.USER),
    MemoryItem(content="主人习惯晚上十一点前睡觉", kind="habit", scope=Scope.USER),
    MemoryItem(content="Cyrene 项目的代号来自一颗小行星", kind="project", scope=Scope.PROJECT),
    MemoryItem(
        content="昨天和主人一起看了海边的日落",
        kind="daily",
        scope=Scope.PERSONA,
        persona_id="xilian",
    ),
    MemoryItem(
        content="主人向阿格莱雅倾诉过工作上的烦恼",
        kind="daily",
        scope=Scope.PERSONA,
        persona_id="aglaea",
    ),
)


def demo_model(spec: str | None = None) -> tuple[BaseChatModel, bool]:
    """The model named by `spec` or $CYRENE_MODEL, else the offline demo model (and True)."""
    spec = spec or os.environ.get(MODEL_ENV)
    if spec:
        return resolve_model(spec, "--model"), False
    return DemoChatModel(), True


def demo_tools(store: MemoryStore, data: Path, zone: ZoneInfo) -> list[BaseTool]:
    """The three tools; `get_time` answers in `zone`, the time block's, not the machine's."""
    notes = data / "notes.txt"

    @tool
    def get_time() -> str:
        """The current local date and time."""
        return datetime.now(zone).strftime("%Y-%m-%d %H:%M")

    @tool
    def search_memory(query: str) -> str:
        """Search the owner's shared memories (habits and project notes)."""
        hits = store.search(query, restricted=True, k=3)
        return "；".join(h.item.content for h in hits) or "没有找到相关记忆"

    @tool
    def take_note(text: str) -> str:
        """Append a note to the owner's notebook."""
        with notes.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
        return "已记下"

    return [get_time, search_memory, take_note]


DEMO_CAPACITY = CapacityPolicy(
    tiers=(
        Tier(name="base", tools=("get_time",)),
        Tier(
            name="memory", tools=("search_memory",), triggers=("记忆", "re:\\b(recall|remember)\\b")
        ),
        Tier(
            name="notes", tools=("take_note",), triggers=("笔记", "记下来", "note"), decay_turns=3
        ),
    )
)


def open_demo_store(data: Path, address: str | None = None) -> MemoryStore:
    """The data folder's store, seeded on first use (re-embedding shown): on the Chroma
    server at `address` or the one `cyrene studio` runs for the folder, else embedded."""
    store = open_store(data, address, progress=Reembedding())
    if not store.list():
        store.add_many(SEED_MEMORIES)
    return store


def demo_config(
    data: Path = DEFAULT_DATA,
    model: BaseChatModel | None = None,
    store: MemoryStore | None = None,
    features: Sequence[Feature] = (),
    **overrides: Any,
) -> LoopConfig:
    """The demo LoopConfig over a data folder (and its store, opened here when not given);
    `features` take the place of the demo's own settings of their kind.

    The short compaction budget and the offline describer come only with the demo
    model: a real one would lose what was said a dozen short turns ago, and be shown
    a file's size instead of the picture."""
    data = Path(data)
    store = store or open_demo_store(data)
    model = model or DemoChatModel()
    timezone = overrides.pop("timezone", DEMO_TIMEZONE)
    stand_ins: list[Feature] = (
        [Compaction(max_context_tokens=DEMO_CONTEXT_TOKENS), Vision(describer=describe_image)]
        if isinstance(model, DemoChatModel)
        else [Compaction(max_context_tokens="auto")]
    )
    config = LoopConfig(
        model=model,
        personas=PERSONAS,
        default_persona="xilian",
        tools=tuple(demo_tools(store, data, ZoneInfo(timezone))),
        restricted_tools=frozenset({"get_time"}),
        memory=store,
        extractor=ManualExtractor(),
        timezone=timezone,
        features=[
            DEMO_CAPACITY.model_copy(update={"on_event": JsonlSink(data / "capacity.jsonl")}),
            TurnEnd(hook=demo_mood),
            ToolCalls(on_audit=JsonlSink(data / "audit.jsonl")),
            *stand_ins,
        ],
        **overrides,
    )
    return config.with_features(*features)
