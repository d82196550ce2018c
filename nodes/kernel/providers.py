"""Provider families: which request shape a chat model needs.

Providers differ in where they take system text (`nodes.context.encoding`), which
message names they accept, and how they spell thinking knobs
(`nodes.thinking.knobs`). The family is read from LangChain's tracing
params, so a wrapper or a gateway model of a known family is recognised too.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.language_models import BaseChatModel

from nodes.kernel.compat import chat_model_provider

Provider = Literal["openai", "anthropic", "ollama", "google", "other"]

_PROVIDER_ALIASES: dict[str, Provider] = {
    "openai": "openai",
    "azure": "openai",
    "azure_openai": "openai",
    "deepseek": "openai",
    "xai": "openai",
    "groq": "openai",
    "openrouter": "openai",
    "anthropic": "anthropic",
    "ollama": "ollama",
    "google_genai": "google",
    "google_vertexai": "google",
    "google": "google",
}


def with_stream_usage(model: BaseChatModel) -> BaseChatModel:
    """An OpenAI-family `model` that asks for usage in its streams (`stream_usage`):
    LangChain turns that on only for OpenAI's own URL, so behind a custom base URL (a
    proxy, a compatible server) a streamed turn counted no tokens. A `stream_usage` its
    caller set stays as set."""
    if getattr(model, "stream_usage", False) is None:
        return model.model_copy(update={"stream_usage": True})
    return model


def provider_of(model: Any) -> Provider:
    """The provider family of a chat model, from LangChain's tracing params or its type."""
    name = chat_model_provider(model) if isinstance(model, BaseChatModel) else ""
    name = name.lower().replace("-chat", "").replace("chat-", "")
    return _PROVIDER_ALIASES.get(name, "other")
