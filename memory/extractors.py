"""Extractors: the finished conversation in, candidate memories and operations out.

An extractor has `extract(messages) -> list[MemoryItem]` and a `background`
flag (`memory.protocols.Extractor`). Both here also have
`extract_operations(messages, memories)` (`memory.protocols.ExtractsOperations`):
shown the readable memories closest to the conversation under handles 1..N,
they may supersede or forget one of them (`memory.operations`). The loop, not
the extractor, decides persona and provenance (see `memory.policy.stamp`):
persona-scope items leave `persona_id` unset, and neither extractor here has a
way to author them, nor to name a memory other than by a handle it was shown.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from memory.items import MemoryItem, Scope
from memory.operations import Add, Forget, Operation, Recalled, Supersede
from memory.protocols import MemoryBackend
from memory.transcript import last_human, message_text

_REMEMBER = re.compile(
    r"(?:请?记住|帮我记住|remember(?:\s+that)?)\s*[:：,，]?\s*(?P<what>.+)",
    re.IGNORECASE | re.DOTALL,
)
# Only at the start: "别忘了…" / "don't forget that…" must never erase anything.
_CORRECT = re.compile(
    r"^\s*(?:更正|纠正一下|correction)\s*[:：,，]?\s*(?P<what>.+)", re.IGNORECASE | re.DOTALL
)
_FORGET = re.compile(
    r"^\s*(?:请|帮我)?(?:忘掉|forget\s+(?:that|about))\s*[:：,，]?\s*(?P<what>.+)",
    re.IGNORECASE | re.DOTALL,
)


def _what(pattern: re.Pattern[str], text: str) -> str:
    """What follows the form's words, without the closing punctuation ('' when no match)."""
    match = pattern.search(text)
    return match.group("what").strip().rstrip("。.!！") if match else ""


class ManualExtractor:
    """Deterministic forms in the owner's latest message. Inline.

    - "记住 X" / "remember X": add X;
    - "更正：X" / "correction: X": X supersedes the closest memory shown (keeping its
      scope and kind); with none shown, X is added;
    - "忘掉 X" / "forget that X": forget the closest memory shown.

    Only the owner's words: a human message with a display name is a third
    party's, and is never stored (the loop also keeps such messages from every
    extractor, see `nodes.extraction.extractable`); restricted sessions never
    reach an extractor at all.
    """

    background = False

    def __init__(self, *, scope: Scope = Scope.PERSONA, kind: str = "note") -> None:
        self.scope = scope
        self.kind = kind

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        """The "记住 X" form alone (the loop calls `extract_operations`)."""
        return [op.item for op in self.extract_operations(messages, []) if isinstance(op, Add)]

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> list[Operation]:
        human = last_human(messages)
        text = message_text(human) if human is not None and not human.name else ""
        closest = memories[0] if memories else None
        if forget := _what(_FORGET, text):
            return [Forget(closest.handle)] if closest is not None and forget else []
        if correct := _what(_CORRECT, text):
            if closest is None:
                return [Add(MemoryItem(content=correct, kind=self.kind, scope=self.scope))]
            old = closest.item  # the persona is the loop's to stamp, as for any new item
            return [
                Supersede(
                    closest.handle, MemoryItem(content=correct, kind=old.kind, scope=old.scope)
                )
            ]
        if remember := _what(_REMEMBER, text):
            # No persona here: the loop stamps the turn's persona (memory.policy.stamp).
            return [Add(MemoryItem(content=remember, kind=self.kind, scope=self.scope))]
        return []


class Candidate(BaseModel):
    """One memory worth keeping. There is deliberately no source field: provenance is the loop's."""

    content: str = Field(
        description="The fact, one sentence, in the conversation's language, in the third "
        "person with the owner as 主人 / the owner."
    )
    kind: str = Field(description="A short tag such as habit, preference, event, plan, fact.")
    scope: Literal["persona", "user", "project"] = Field(
        description="persona: private to this persona's relationship with the owner; "
        "user: the owner's habits and preferences; project: shared, non-sensitive knowledge."
    )


class Candidates(BaseModel):
    items: list[Candidate] = Field(default_factory=list)


class MemoryOperation(Candidate):
    """One change to what is remembered. Memories are named by the number shown, never an id."""

    op: Literal["add", "supersede", "forget", "none"] = Field(
        description="add: a new fact; supersede: the memory numbered `handle` is no longer "
        "true and `content` replaces it; forget: the owner asked to forget memory `handle`; "
        "none: nothing to do."
    )
    handle: int | None = Field(
        default=None, description="For supersede and forget: the number of the memory shown."
    )
    content: str = Field(default="", description="For add and supersede: the fact, one sentence.")
    kind: str = Field(default="fact", description="A short tag such as habit, preference, plan.")
    scope: Literal["persona", "user", "project"] = Field(default="user")


class MemoryOperations(BaseModel):
    operations: list[MemoryOperation] = Field(default_factory=list)


EXTRACTION_PROMPT = (
    "你负责从对话中提取值得长期记住的信息。只提取主人明确表达的、将来仍然有用的事实、习惯、偏好或计划；"
    "不要提取寒暄、一次性的问题或助手自己的话。没有值得记住的内容时返回空列表。"
    "每条记忆用第三人称写，用「主人」指代主人（例如「主人养了一只叫团子的橘猫」）：提问时会按这个说法查找。"
)
OPERATIONS_PROMPT = EXTRACTION_PROMPT + (
    "\n下面列出已有的相关记忆，每条前面有编号。对每条新信息选择一个操作："
    "add（新的事实，已有记忆里没有）；supersede（某条已有记忆不再成立，用新事实取代它，填它的编号）；"
    "forget（主人明确要求忘掉某条记忆，填它的编号）；none（已经记住了或不值得记）。"
    "只能用列出的编号，不要编造编号；同一件事已经记住时不要再 add。"
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
        self.operations_model = model.with_structured_output(MemoryOperations)
        self.store = store
        self.duplicate_relevance = duplicate_relevance
        self.background = background
        self.window = window

    def prompt(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled] | None = None
    ) -> list[BaseMessage]:
        """The request: the instructions, then the conversation's last `window` messages
        (and, for operations, the memories shown, numbered)."""
        lines = [
            f"{m.type}({m.name}): {message_text(m)}" if m.name else f"{m.type}: {message_text(m)}"
            for m in messages[-self.window :]
            if m.type in ("human", "ai") and message_text(m)
        ]
        if memories is None:
            return [SystemMessage(EXTRACTION_PROMPT), HumanMessage("\n".join(lines))]
        shown = [f"{r.handle}. [{r.item.kind}] {r.item.content}" for r in memories] or ["（无）"]
        text = "已有记忆：\n" + "\n".join(shown) + "\n\n对话：\n" + "\n".join(lines)
        return [SystemMessage(OPERATIONS_PROMPT), HumanMessage(text)]

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> list[Operation]:
        """The model's operations on the memories shown (handles it was not shown are the
        loop's to refuse)."""
        result = self.operations_model.invoke(self.prompt(messages, memories))
        decision = (
            result
            if isinstance(result, MemoryOperations)
            else MemoryOperations.model_validate(result)
        )
        operations: list[Operation] = []
        for choice in decision.operations:
            handle = choice.handle if choice.handle is not None else 0
            if choice.op == "forget":
                operations.append(Forget(handle))
            elif choice.op in ("add", "supersede") and choice.content.strip():
                item = MemoryItem(
                    content=choice.content, kind=choice.kind or "fact", scope=Scope(choice.scope)
                )
                operations.append(Add(item) if choice.op == "add" else Supersede(handle, item))
        return operations

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
