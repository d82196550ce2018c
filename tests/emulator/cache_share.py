"""Cached share of input tokens, as the providers bill it, over long chats on the wire.

    python -m tests.emulator.cache_share      # the table: provider × layout × chat

`tests/bench/cache.py` measures what a cache *could* reuse, comparing each
scripted request's payload with the one before; this runs the same companion
(its instructions, memories, topics, replies and tool, imported from there)
through the real `ChatOpenAI` / `ChatAnthropic` against the emulator, whose
usage says what the provider *did* read from its cache (`tests.emulator.tokens`:
OpenAI's automatic prefix cache, Anthropic's breakpoints). The chats are the
issue's (issue 32, "Done when"):

- owner: 30 turns, a tool call every fifth turn, the persona switched at turns
  10 and 20 (and back);
- group: 20 turns, four speakers in turn (three third parties and the owner);

both with the clock 3 minutes later each turn, a time zone, working memory
rewritten every turn, a memory store, and a compaction budget small enough
that compaction fires (`Share.compacted_at` says when). The share is
cache reads over all input tokens of every reply request from turn 6 on;
Anthropic's cache writes are reported beside it (billed at 1.25×).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import (
    Compaction,
    LoopConfig,
    ModelView,
    Persona,
    SessionEnv,
    build_graph,
    open_checkpointer,
)
from memory import MemoryItem, MemoryStore, Scope
from memory.embedding import HashingEmbedding
from tests.bench.cache import INSTRUCTIONS, MEMORIES, START, TOPICS, replies, weather
from tests.emulator.fixtures import client, tiktoken_offline
from tests.emulator.script import Call, Reply
from tests.emulator.server import Emulator
from tests.emulator.wire import Request

Clock = Callable[[], datetime]
Transform = Callable[[list[BaseMessage], int], list[BaseMessage]]
STEADY_FROM = 5
"""The first steady turn's index (turn 6)."""
AGLAEA = INSTRUCTIONS.replace("昔涟", "阿格莱雅").replace("温柔、好奇", "沉静、克制")
PERSONAS = {
    "xilian": Persona(name="昔涟", instructions=INSTRUCTIONS),
    "aglaea": Persona(name="阿格莱雅", instructions=AGLAEA),
}
BUDGETS = {
    ("openai", "owner"): 1500,
    ("openai", "group"): 1600,
    ("anthropic", "owner"): 4900,
    ("anthropic", "group"): 4500,
}
"""Compaction budgets that make it fire once in each chat under `"cache"`, late (a smaller
budget makes it fire every turn from then on: compaction folds the conversation down to half
the budget, and the lead of every persona's instructions comes on top). OpenAI's are in
LangChain's estimate (tiktoken is offline here: ~4 characters a token), Anthropic's in its
token counter's (the emulator's: a token per CJK character)."""


@dataclass(frozen=True)
class Chat:
    """A conversation to replay: its turns, who speaks each, and which persona answers."""

    name: str
    turns: int
    speakers: tuple[str | None, ...]
    """Display names in turn (None: the owner); more than one makes it a group chat."""
    switches: tuple[tuple[int, str], ...] = ()
    """(turn, persona) pairs: from that turn on, the persona the owner talks to."""

    def persona(self, turn: int) -> str:
        return next((p for t, p in sorted(self.switches, reverse=True) if turn >= t), "xilian")

    def env(self, turn: int) -> SessionEnv:
        if len(self.speakers) > 1:
            return SessionEnv(actor="group")
        return SessionEnv(actor="owner", persona_id=self.persona(turn))


OWNER = Chat("owner", 30, (None,), ((10, "aglaea"), (20, "xilian")))
GROUP = Chat("group", 20, ("小明", "小红", "阿强", None))


@dataclass(frozen=True)
class Share:
    """What the provider read from its cache over the steady turns of one chat."""

    provider: str
    layout: str
    chat: str
    read: int
    written: int
    total: int
    requests: int
    compacted_at: tuple[int, ...]
    """The turns (from 0) whose first request followed a compaction."""
    per_turn: tuple[float, ...]
    """The read share of each turn's first request, every turn (a switch shows as a dip)."""

    @property
    def compactions(self) -> int:
        return len(self.compacted_at)

    @property
    def share(self) -> float:
        return self.read / self.total if self.total else 0.0


def as_reply(message: AIMessage) -> Reply:
    """The bench's scripted reply as the emulator's."""
    calls = tuple(Call(c["name"], c["args"]) for c in message.tool_calls)
    return Reply(message.text, calls)


def split(request: Request) -> tuple[int, int, int]:
    """(read, written, total) input tokens of one answered request."""
    usage = request.usage or {}
    if request.provider == "openai":
        return usage["prompt_tokens_details"]["cached_tokens"], 0, usage["prompt_tokens"]
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    return read, written, read + written + usage["input_tokens"]


def replay(
    api: Emulator,
    provider: str,
    layout: str,
    chat: Chat,
    folder: Path,
    budget: int,
    transform: Transform | None = None,
) -> tuple[list[int], tuple[int, ...]]:
    """Run `chat` against `api`: (the number of each turn's first request, the turns that
    compacted)."""
    now = [START]
    starts, covered = [], [None]  # covered: what each turn's summary covers, None before one
    with MemoryStore.open(folder, HashingEmbedding()) as store:
        store.add_many([MemoryItem(content=t, kind=k, scope=Scope.USER) for t, k in MEMORIES])
        config = companion(client(api, provider), store, layout, budget, lambda: now[0], transform)
        thread = {"configurable": {"thread_id": chat.name}}
        with open_checkpointer("memory") as saver:
            graph = build_graph(config, saver)
            for turn in range(chat.turns):
                now[0] = START + timedelta(minutes=3 * turn)
                starts.append(len(api.requests) + 1)
                api.reply(*(as_reply(m) for m in replies(turn)))
                values = graph.invoke(turn_input(chat, turn), thread, context=chat.env(turn))
                covered.append((values.get("summary") or {}).get("upto"))
    return starts, tuple(turn for turn, (a, b) in enumerate(pairwise(covered)) if a != b)


def companion(
    model: BaseChatModel,
    store: MemoryStore,
    layout: str,
    budget: int,
    clock: Clock,
    transform: Transform | None = None,
) -> LoopConfig:
    """The bench's companion on `model`: two personas, the weather tool (groups may use it),
    memories, a time zone, and the clock the replay moves (`transform`: the view's, as
    `ModelView.transform`)."""
    return LoopConfig(
        model=model,
        personas=PERSONAS,
        default_persona="xilian",
        tools=[weather],
        restricted_tools={"weather"},
        memory=store,
        timezone="Asia/Shanghai",
        clock=clock,
        features=[
            ModelView(layout=layout, transform=transform),
            Compaction(max_context_tokens=budget),
        ],
    )


def turn_input(chat: Chat, turn: int) -> dict[str, Any]:
    """The turn's message (from its speaker) and the working memory the application sets."""
    text, topic = TOPICS[turn % len(TOPICS)]
    speaker = chat.speakers[turn % len(chat.speakers)]
    memo = f"主人刚提到{topic}；这是今天第{turn + 1}段对话"
    return {"messages": [HumanMessage(text, name=speaker)], "working_memory": memo}


@dataclass(frozen=True)
class Recording:
    """One replayed chat: every request the emulator answered, and where each turn began."""

    requests: list[Request]
    """The accepted reply requests, in order."""
    starts: list[int]
    """The number of each turn's first request."""
    compacted_at: tuple[int, ...]

    def turn_of(self, request: Request) -> int:
        return sum(start <= request.number for start in self.starts) - 1

    def steady(self) -> list[Request]:
        first = min(STEADY_FROM, len(self.starts) - 1)
        return [r for r in self.requests if self.turn_of(r) >= first]


def record(
    provider: str,
    layout: str,
    chat: Chat,
    folder: Path,
    budget: int | None = None,
    transform: Transform | None = None,
) -> Recording:
    """`chat` replayed on `provider` under `layout` (compaction budget: `BUDGETS`' unless
    given; 0 turns compaction off; `transform`: the view's)."""
    budget = BUDGETS[provider, chat.name] if budget is None else budget
    with Emulator() as api, tiktoken_offline():
        starts, compacted_at = replay(api, provider, layout, chat, folder, budget, transform)
    answered = [r for r in api.generations() if r.accepted]
    return Recording(answered, starts, compacted_at)


def measure(
    provider: str, layout: str, chat: Chat, folder: Path, budget: int | None = None
) -> Share:
    """The cached share of `chat` replayed on `provider` under `layout` (compaction budget:
    `BUDGETS`' unless given; 0 turns compaction off)."""
    recording = record(provider, layout, chat, folder, budget)
    steady = [split(r) for r in recording.steady()]
    firsts = [
        next(split(r) for r in recording.requests if r.number >= start)
        for start in recording.starts
    ]
    return Share(
        provider=provider,
        layout=layout,
        chat=chat.name,
        read=sum(p[0] for p in steady),
        written=sum(p[1] for p in steady),
        total=sum(p[2] for p in steady),
        requests=len(steady),
        compacted_at=recording.compacted_at,
        per_turn=tuple(read / total for read, _, total in firsts),
    )


def table(folder: Path) -> list[Share]:
    """Every provider × layout × chat."""
    return [
        measure(provider, layout, chat, folder / f"{provider}-{layout}-{chat.name}")
        for provider in ("openai", "anthropic")
        for layout in ("round_first", "cache")
        for chat in (OWNER, GROUP)
    ]


def main() -> None:
    print("| provider | layout | chat | cached share | written | requests | compacted at turn |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for s in table(Path(tmp)):
            written = f"{s.written / s.total:.2f}" if s.total else "—"
            turns = ", ".join(str(turn + 1) for turn in s.compacted_at) or "—"
            print(
                f"| {s.provider} | {s.layout} | {s.chat} | {s.share:.2f} | {written} "
                f"| {s.requests} | {turns} |"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
