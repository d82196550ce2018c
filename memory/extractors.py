"""Extractors: the finished conversation in, candidate memories out.

An extractor has `extract(messages) -> list[MemoryItem]` and a `background`
flag (`memory.protocols.Extractor`). The loop, not the extractor, decides
persona and provenance (see `memory.policy.stamp`): persona-scope items leave
`persona_id` unset, and neither extractor here has a way to author them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from memory.items import MemoryItem, Scope
from memory.protocols import MemoryBackend
from memory.transcript import last_human, message_text

_REMEMBER = re.compile(
    r"(?:请?记住|帮我记住|remember(?:\s+that)?)\s*[:：,，]?\s*(?P<what>.+)",
    re.IGNORECASE | re.DOTALL,
)


class ManualExtractor:
    """Deterministic: "记住 X" / "remember X" in the owner's latest message → one memory. Inline.

    Only the owner's words: a human message with a display name is a third
    party's, and is never stored (the loop also keeps such messages from every
    extractor, see `nodes.extraction.extractable`).
    """

    background = False

    def __init__(self, *, scope: Scope = Scope.PERSONA, kind: str = "note") -> None:
        self.scope = scope
        self.kind = kind

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        human = last_human(messages)
        match = _REMEMBER.search(message_text(human)) if human and not human.name else None
        if not match:
            return []
        what = match.group("what").strip().rstrip("。.!！")
        if not what:
            return []
        # No persona here: the loop stamps the turn's persona (memory.policy.stamp).
        return [MemoryItem(content=what, kind=self.kind, scope=self.scope)]


class Candidate(BaseModel):
    """One memory worth keeping. There is deliberately no source field: provenance is the loop's."""

    content: str = Field(description="The fact, one sentence, in the conversation's language.")
    kind: str = Field(description="A short tag such as habit, preference, event, plan, fact.")
    scope: Literal["persona", "user", "project"] = Field(
        description="persona: private to this persona's relationship with the owner; "
        "user: the owner's habits and preferences; project: shared, non-sensitive knowledge."
    )


class Candidates(BaseModel):
    items: list[Candidate] = Field(default_factory=list)


EXTRACTION_PROMPT = (
    "你负责从对话中提取值得长期记住的信息。只提取主人明确表达的、将来仍然有用的事实、习惯、偏好或计划；"
    "不要提取寒暄、一次性的问题或助手自己的话。没有值得记住的内容时返回空列表。"
)


class LLMExtractor:
    """A chat model with structured output proposes memories; near-duplicates are skipped.

    Runs in the background by default: the reply never waits for it.
    """

    def __init__(
        self,
        model: BaseChatModel,
        *,
        store: MemoryBackend | None = None,
        duplicate_relevance: float = 0.92,
        background: bool = True,
        window: int = 12,
    ) -> None:
        self.model = model.with_structured_output(Candidates)
        self.store = store
        self.duplicate_relevance = duplicate_relevance
        self.background = background
        self.window = window

    def prompt(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        lines = [
            f"{m.type}({m.name}): {message_text(m)}" if m.name else f"{m.type}: {message_text(m)}"
            for m in messages[-self.window :]
            if m.type in ("human", "ai") and message_text(m)
        ]
        return [SystemMessage(EXTRACTION_PROMPT), HumanMessage("\n".join(lines))]

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        result = self.model.invoke(self.prompt(messages))
        candidates = (
            result.items
            if isinstance(result, Candidates)
            else Candidates.model_validate(result).items
        )
        items = []
        for candidate in candidates:
            if not candidate.content.strip() or self._is_duplicate(candidate.content):
                continue
            items.append(
                MemoryItem(
                    content=candidate.content,
                    kind=candidate.kind or "fact",
                    scope=Scope(candidate.scope),
                )
            )
        return items

    def _is_duplicate(self, content: str) -> bool:
        if self.store is None:
            return False
        hits = self.store.search(content, k=1)
        return bool(hits) and hits[0].relevance >= self.duplicate_relevance
