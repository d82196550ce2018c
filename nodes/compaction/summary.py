"""Context compaction: summarise older turns, keep the tail whole.

The transcript is never shortened. State keeps a `summary` — its text and the
id of the last message it covers — and the model view becomes
"summary + everything after it". Planning is pure: a cut is only ever placed on
a non-tool message at or before the turn's opening user message, so an AI
message with tool calls is never separated from its results and the tail
always holds the latest user message and whatever followed it.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately

from nodes.compaction.settings import Compactor, Describe
from nodes.kernel.messages import message_text
from nodes.kernel.text import as_data
from nodes.kernel.transcript import turn_start

log = logging.getLogger("cyrene.compaction")

CHARS_PER_TOKEN = 4.0  # count_tokens_approximately's default
TokenCounter = Callable[[Sequence[BaseMessage]], int]


def plan_cut(
    messages: Sequence[BaseMessage], start: int, tail_budget: int, sizes: Sequence[int]
) -> int | None:
    """The smallest legal cut whose tail fits `tail_budget`, else the largest legal cut.

    `sizes[i]` is the token estimate of `messages[i]`. Legal cuts lie in
    (start, turn opening] on a non-tool message. None when nothing older than
    the current turn is left to fold.
    """
    opening = turn_start(messages)
    tail = sum(sizes[opening:])
    best = None
    # Walk cuts from the newest legal one backwards, growing the tail.
    for cut in range(opening, start, -1):
        if cut < opening:
            tail += sizes[cut]
        if isinstance(messages[cut], ToolMessage):
            continue
        if tail > tail_budget:
            return best if best is not None else cut
        best = cut
    return best


_WIDE = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
"""CJK ideographs, kana, hangul and full-width forms."""


@dataclass
class StructuralCompactor:
    """No model call: the first line of each older message, with its speaker, newest kept."""

    line_chars: int = 80
    wide_tokens: float = 1.0
    """What a CJK character counts when the summary is measured against its share of the
    budget: a token, as in a model's own tokenizer (Claude's counter gives each its own,
    tiktoken about one); `1 / CHARS_PER_TOKEN` where the budget is LangChain's estimate
    (the compaction sets that for a model without a counter of its own). Counted at
    LangChain's rate under a real tokenizer, a Chinese summary passed its share, the view
    stayed over budget after compaction, and every later round compacted again."""

    def line_tokens(self, line: str) -> float:
        """A summary line's tokens, its newline included: the rest four characters a token."""
        wide = len(_WIDE.findall(line))
        return wide * self.wide_tokens + (len(line) + 1 - wide) / CHARS_PER_TOKEN

    def compact(
        self, messages: Sequence[BaseMessage], previous: str | None, budget: int, describe: Describe
    ) -> str:
        lines = previous.splitlines() if previous else []
        for message in messages:
            text = message_text(message).strip().splitlines()
            if isinstance(message, ToolMessage):
                first = f"工具 {message.name or ''}：{text[0] if text else ''}"
            elif text:
                first = f"{describe(message)}：{text[0]}"
            else:
                continue
            lines.append("- " + first[: self.line_chars])
        # Keep the newest lines that fit.
        room, kept = float(budget), 0
        for line in reversed(lines):
            room -= self.line_tokens(line)
            if room < 0 and kept:
                break
            kept += 1
        return "\n".join(lines[-kept:]) if kept else ""


COMPACTION_PROMPT = (
    "你在维护一段长对话的滚动摘要。把「已有摘要」与「新增对话」合并成一份新的摘要：保留事实、约定、"
    "未完成的事，以及每句话是谁说的（保留方括号里的发言人标注），删去寒暄。只输出摘要本身。"
)


class LLMCompactor:
    """A chat model writes the summary, incrementally: it sees only what is new since the last one."""

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model

    def prompt(
        self, messages: Sequence[BaseMessage], previous: str | None, budget: int, describe: Describe
    ) -> list:
        # Each message one line of data: a participant cannot write a line that reads as
        # another speaker's ("[主人] …") for the model that summarises.
        lines = [f"[{describe(m)}] {as_data(message_text(m))}" for m in messages if message_text(m)]
        body = f"已有摘要：\n{previous or '（无）'}\n\n新增对话：\n" + "\n".join(lines)
        return [
            SystemMessage(f"{COMPACTION_PROMPT}摘要不超过约 {budget} 个 token。"),
            HumanMessage(body),
        ]

    def compact(
        self, messages: Sequence[BaseMessage], previous: str | None, budget: int, describe: Describe
    ) -> str:
        return message_text(
            self.model.invoke(self.prompt(messages, previous, budget, describe))
        ).strip()


class _Counted(weakref.ref):
    """A message's remembered count: one object per message, which the message's end drops."""

    __slots__ = ("count", "key")
    key: int
    count: int


class RememberedEstimate:
    """`count_tokens_approximately`, with each message's count remembered while it lives.

    The check before every round counts the whole window, which is the same messages
    round after round (a loaded transcript keeps its message objects), and the estimate
    of a list is the sum of its messages' (each rounded up on its own), so a sum of
    remembered counts is the same number. A message is never changed in place (an edit
    is a copy under its id), so its count stays true; the entry goes with the message.
    """

    def __init__(self) -> None:
        self._known: dict[int, _Counted] = {}

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        total = 0
        for message in messages:
            known = self._known.get(id(message))
            if known is not None and known() is message:
                total += known.count
            elif isinstance(message, BaseMessage):
                total += self._remember(message)
            else:  # a message-like value (a tuple, a dict): counted, not kept
                total += count_tokens_approximately([message])
        return total

    def _remember(self, message: BaseMessage) -> int:
        counted = _Counted(message, self._forget)
        counted.key, counted.count = id(message), count_tokens_approximately([message])
        self._known[counted.key] = counted
        return counted.count

    def _forget(self, counted: _Counted) -> None:
        # No lock: this runs inside a collection, wherever one starts. Two threads racing
        # here can only drop an entry, which is counted again when asked.
        if self._known.get(counted.key) is counted:
            self._known.pop(counted.key, None)


approximate_tokens = RememberedEstimate()
"""LangChain's estimate, each message counted once while it lives."""


def in_budget_units(compactor: Compactor, count: TokenCounter) -> Compactor:
    """`compactor`, a structural one measuring its summary in `count`'s units (LangChain's
    estimate counts a CJK character a quarter of a token)."""
    if count is approximate_tokens and isinstance(compactor, StructuralCompactor):
        return replace(compactor, wide_tokens=1 / CHARS_PER_TOKEN)
    return compactor


def token_counter(model: Any) -> TokenCounter:
    """The model's own counter when its class provides one (and it works offline), else LangChain's
    estimate (`approximate_tokens`)."""
    own = getattr(type(model), "get_num_tokens_from_messages", None)
    if own is None or own is BaseChatModel.get_num_tokens_from_messages:
        return approximate_tokens

    def count(messages: Sequence[BaseMessage]) -> int:
        if all(isinstance(m, SystemMessage) for m in messages):
            # Anthropic's counter is its count_tokens API, which refuses system text alone.
            return count_tokens_approximately(messages)
        try:
            return model.get_num_tokens_from_messages(list(messages))
        except Exception:  # e.g. a tokenizer that would download its vocabulary
            return count_tokens_approximately(messages)

    return count
