"""Extractors: the finished conversation in, candidate memories and operations out.

An extractor has `extract(messages) -> list[MemoryItem]` and a `background`
flag (`memory.protocols.Extractor`). Both here also have
`extract_operations(messages, memories)` (`memory.protocols.ExtractsOperations`):
shown the readable memories closest to the conversation under handles 1..N,
they may supersede or forget one of them (`memory.lifecycle.operations`). The loop, not
the extractor, decides persona and provenance (see `memory.lifecycle.policy.stamp`):
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
from memory.lifecycle.naming import SHARED, covers, named, shares
from memory.lifecycle.operations import Add, Forget, Operation, Recalled, Restated, Supersede
from memory.protocols import MemoryBackend
from nodes.kernel.messages import last_human, message_text

# Each form only at the start: "别忘了…", "我差点忘掉…", "你还记住…吗" are no requests.
_REMEMBER = re.compile(
    r"^\s*(?:(?:请|帮我|麻烦你?)?记住|(?:please\s+)?remember(?:\s+that)?\b)\s*[:：,，]?\s*(?P<what>.*)",
    re.IGNORECASE | re.DOTALL,
)
_CORRECT = re.compile(
    r"^\s*(?:(?:更正|纠正)(?:一下)?|correction)\s*[:：,，]?\s*(?P<what>.*)",
    re.IGNORECASE | re.DOTALL,
)
_FORGET = re.compile(
    r"^\s*(?:(?:请|帮我)?忘掉|(?:please\s+)?forget\s+(?:that|about))\s*[:：,，]?\s*(?P<what>.*)",
    re.IGNORECASE | re.DOTALL,
)
_QUESTION = re.compile(r"(?:[?？]|[吗呢么]\s*[。.!！]?)\s*$")
SUPERSEDE_RELEVANCE = 0.35
"""The store's relevance a memory needs to be the one a correction supersedes (measured on
`tests/data/memory_phrases.jsonl`: the facts corrected there score 0.38-0.79, the
closest memory of a correction that names none at most 0.36)."""
SUPERSEDE_MARGIN = 0.03
"""How far ahead of the next memory it must be: a tie is no correction of either."""


def _what(pattern: re.Pattern[str], text: str) -> str | None:
    """What follows the form's words, without the closing punctuation (None: no match)."""
    match = pattern.search(text)
    return match.group("what").strip().rstrip("。.!！") if match else None


def _relevance(memory: Recalled) -> float:
    return memory.relevance if memory.relevance is not None else 0.0


def _corrected(memories: Sequence[Recalled], said: str) -> Recalled | None:
    """The memory a correction supersedes: the clearly closest, sharing its subject."""
    if not memories or _relevance(memories[0]) < SUPERSEDE_RELEVANCE:
        return None
    runner_up = _relevance(memories[1]) if len(memories) > 1 else 0.0
    top = memories[0]
    if _relevance(top) - runner_up < SUPERSEDE_MARGIN or shares(top.item.content, said) < SHARED:
        return None
    return top


class ManualExtractor:
    """Deterministic forms at the start of the owner's latest message. Inline.

    - "记住 X" / "remember X": add X, when X is a statement (not a question);
    - "更正：X" / "correction: X": X supersedes the memory it corrects (the clearly
      closest one shown, sharing its subject: `memory.lifecycle.naming.shares`), keeping its scope
      and kind; when none is, X is added;
    - "忘掉 X" / "forget that X": forget the memory X names (the closest shown whose
      words cover X's: `memory.lifecycle.naming.covers`); when none does, nothing.

    A form whose X names nothing ("忘掉吧，没什么", "forget that, never mind",
    "更正一下，我刚才说错了") changes nothing: the reply can ask what was meant.
    Only the owner's words: a human message with a display name is a third party's,
    and is never stored (the loop also keeps such messages from every extractor, see
    `nodes.extraction.node.extractable`); restricted sessions never reach an extractor at all.
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
        if (forget := _what(_FORGET, text)) is not None:
            named_one = next((m for m in memories if covers(m.item.content, forget)), None)
            return [Forget(named_one.handle)] if named_one is not None and named(forget) else []
        if (correct := _what(_CORRECT, text)) is not None:
            if not named(correct):
                return []
            old = _corrected(memories, correct)
            if old is None:
                return [Add(MemoryItem(content=correct, kind=self.kind, scope=self.scope))]
            # The persona is the loop's to stamp, as for any new item.
            new = MemoryItem(content=correct, kind=old.item.kind, scope=old.item.scope)
            return [Supersede(old.handle, new)]
        remember = _what(_REMEMBER, text)
        if remember is None or not named(remember) or _QUESTION.search(remember):
            return []
        # No persona here: the loop stamps the turn's persona (memory.lifecycle.policy.stamp).
        return [Add(MemoryItem(content=remember, kind=self.kind, scope=self.scope))]


SCOPE_DESCRIPTION = (
    "persona: private to this persona's relationship with the owner, never shown in a group "
    "or to a stranger (anything personal or sensitive: where the owner lives, health, money, "
    "secrets); user: the owner's everyday habits and preferences, which every persona and "
    "also group and stranger chats may see; project: shared, non-sensitive knowledge."
)
"""What the model is told of scopes: that `user` reaches group and stranger chats, so a
private fact is not filed there by default."""


class Candidate(BaseModel):
    """One memory worth keeping. There is deliberately no source field: provenance is the loop's."""

    content: str = Field(
        description="The fact, one sentence, in the conversation's language, in the third "
        "person with the owner as 主人 / the owner."
    )
    kind: str = Field(description="A short tag such as habit, preference, event, plan, fact.")
    scope: Literal["persona", "user", "project"] = Field(description=SCOPE_DESCRIPTION)


class Candidates(BaseModel):
    items: list[Candidate] = Field(default_factory=list)


class MemoryOperation(BaseModel):
    """One change to what is remembered. Memories are named by the number shown, never an id."""

    op: Literal["add", "supersede", "forget", "none"] = Field(
        description="add: a new fact; supersede: the memory numbered `handle` is no longer "
        "true and `content` replaces it; forget: the owner asked to forget memory `handle`; "
        "none: nothing to do (when the fact is already remembered, `handle` is the number of "
        "the memory that says it)."
    )
    handle: int | None = Field(
        default=None,
        description="For supersede and forget: the number of the memory shown; for none, that "
        "of the memory that already says the fact, if one does.",
    )
    content: str = Field(default="", description="For add and supersede: the fact, one sentence.")
    kind: str = Field(default="fact", description="A short tag such as habit, preference, plan.")
    scope: Literal["persona", "user", "project"] | None = Field(
        default=None,
        description=SCOPE_DESCRIPTION
        + " Left out: persona for add, the replaced memory's own for supersede.",
    )


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
    "forget（主人明确要求忘掉某条记忆，填它的编号）；none（已经记住了——填说着这件事的那条记忆的编号——或不值得记）。"
    "只能用列出的编号，不要编造编号；同一件事已经记住时不要再 add。"
    "supersede 和 forget 只用于主人的话明确指出的那一条：「忘掉吧」「算了，没什么」「更正一下」"
    "「forget that, never mind」这类没有说是哪条的话，以及说的是一件没记过的事（例如问到没存过的"
    "银行卡号），都不做任何操作，回复里可以问主人指的是哪条；问句不是事实，不要 add。"
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
        scopes = {r.handle: r.item.scope for r in memories}
        operations: list[Operation] = []
        for choice in decision.operations:
            handle = choice.handle if choice.handle is not None else 0
            if choice.op == "forget":
                operations.append(Forget(handle))
            elif choice.op == "none" and choice.handle is not None:
                operations.append(Restated(handle))
            elif choice.op in ("add", "supersede") and choice.content.strip():
                # Unnamed, a new fact stays private; a correction stays where the fact was.
                if choice.scope:
                    scope = Scope(choice.scope)
                elif choice.op == "supersede":
                    scope = scopes.get(handle, Scope.PERSONA)
                else:
                    scope = Scope.PERSONA
                item = MemoryItem(content=choice.content, kind=choice.kind or "fact", scope=scope)
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
