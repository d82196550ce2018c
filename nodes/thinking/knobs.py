"""Per-persona thinking knobs mapped onto each provider's request parameters.

Knobs are resolved per persona and injected into every model request. Providers spell them differently: OpenAI-compatible APIs
take `reasoning_effort`, Anthropic takes a `thinking` budget, Ollama a
`reasoning` switch, Gemini a `thinking_budget`. A provider this module does not
know gets no knobs at all — never an error.

Only a model that reasons takes them: OpenAI answers 400
`unsupported_parameter` to `reasoning_effort` on gpt-4o-mini, Anthropic 400 to
`thinking` on Claude 3.5. Whether it reasons is the persona's
`model_accepts_thinking`, else LangChain's model profile (`reasoning_output`);
a model with no profile is sent them, as asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from nodes.kernel.providers import Provider

REASONING_BLOCK_TYPES = frozenset({"reasoning", "thinking", "redacted_thinking"})
REASONING_KWARGS = ("reasoning_content", "reasoning")
ANTHROPIC_THINKING = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class Knobs:
    """Resolved thinking knobs for one turn."""

    thinking_budget: int | None = None
    reasoning_effort: str | None = None
    show_thinking: bool = True
    model_accepts_thinking: bool | None = None
    """Whether the persona's own model takes the knobs; None reads its profile."""


def profile_reasons(model: BaseChatModel) -> bool | None:
    """Whether LangChain's profile of `model` says it reasons (`reasoning_output`); None
    when it has no profile or the profile does not say."""
    reasons = (getattr(model, "profile", None) or {}).get("reasoning_output")
    return reasons if isinstance(reasons, bool) else None


def request_kwargs(provider: Provider, knobs: Knobs) -> dict[str, Any]:
    """Extra request parameters carrying the knobs for this provider."""
    budget, effort = knobs.thinking_budget, knobs.reasoning_effort
    if provider == "openai" and effort:
        return {"reasoning_effort": effort}
    if provider == "anthropic" and budget:
        return {"thinking": {"type": "enabled", "budget_tokens": budget}}
    if provider == "ollama" and (effort or budget):
        return {"reasoning": effort or True}
    if provider == "google" and budget is not None:
        return {"thinking_budget": budget}
    return {}


def continues_round_without_thinking(view: Sequence[BaseMessage]) -> bool:
    """Whether `view` continues a tool round (results follow its last reply: Anthropic
    sends them, and whatever follows, as one user turn) whose reply does not open with a
    thinking block: a round begun on another provider, or with thinking off. Anthropic
    refuses `thinking` on such a request (400 "a final `assistant` message must start
    with a thinking block")."""
    replies = [i for i, message in enumerate(view) if isinstance(message, AIMessage)]
    if not replies or not any(isinstance(m, ToolMessage) for m in view[replies[-1] + 1 :]):
        return False
    content = view[replies[-1]].content
    first = content[0] if isinstance(content, list) and content else None
    return not (isinstance(first, dict) and first.get("type") in ANTHROPIC_THINKING)


def has_reasoning(message: BaseMessage) -> bool:
    content = message.content
    blocks = content if isinstance(content, list) else []
    return any(
        isinstance(b, dict) and b.get("type") in REASONING_BLOCK_TYPES for b in blocks
    ) or any(k in message.additional_kwargs for k in REASONING_KWARGS)


MessageT = TypeVar("MessageT", bound=BaseMessage)


def without_reasoning(message: MessageT) -> MessageT:
    """A copy of the message with thinking removed (content blocks and provider kwargs)."""
    if not has_reasoning(message):
        return message
    content = message.content
    if isinstance(content, list):
        content = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") in REASONING_BLOCK_TYPES)
        ]
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k not in REASONING_KWARGS}
    return message.model_copy(update={"content": content, "additional_kwargs": kwargs})
