"""The base of the chat models that answer from code: the demo model and the tests' script.

A subclass says what it replies to a request (`reply_to`) and, if it streams
in pieces, how (`chunks`); generation and streaming are `nodes.kernel.chat_model`'s,
`bind_tools` is here.
A `BaseChatModel` has no `bind_tools` of its own (a real provider binds its
own tool schema); these models need only the OpenAI function shape, which they
read back to see which tools they were offered.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool

from nodes.kernel.chat_model import Kwargs, Messages, ReplyChatModel, RunManager, as_chunk


class OfflineChatModel(ReplyChatModel):
    """A chat model whose replies come from `reply_to`; `bind_tools` binds OpenAI schemas."""

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def reply_to(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        """The reply to `messages`, sent with the request's `kwargs` (bound tools and the like)."""
        raise NotImplementedError

    def chunks(self, message: AIMessage) -> Iterator[AIMessageChunk]:
        """How `message` streams: by default in one chunk, as a non-streaming model does."""
        yield as_chunk(message)

    def reply(self, messages: Messages, run_manager: RunManager, kwargs: Kwargs) -> BaseMessage:
        return self.reply_to(messages, kwargs)

    def stream_reply(
        self, messages: Messages, run_manager: RunManager, kwargs: Kwargs
    ) -> Iterator[AIMessageChunk]:
        return self.chunks(self.reply_to(messages, kwargs))


def bound_tool_names(kwargs: dict[str, Any]) -> list[str]:
    """Names of the tools `bind_tools` put in a request's kwargs, in order."""
    return [t["function"]["name"] for t in kwargs.get("tools", [])]
