"""The base of the chat models that answer from code: the demo model and the tests' script.

A subclass says what it replies to a request (`reply_to`) and, if it streams
in pieces, how (`chunks`); generation, streaming and `bind_tools` are shared.
A `BaseChatModel` has no `bind_tools` of its own (a real provider binds its
own tool schema); these models need only the OpenAI function shape, which they
read back to see which tools they were offered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool


class OfflineChatModel(BaseChatModel):
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

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.reply_to(messages, kwargs))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self.chunks(self.reply_to(messages, kwargs)):
            yield ChatGenerationChunk(message=chunk)


def as_chunk(message: AIMessage) -> AIMessageChunk:
    """The whole message as one chunk, its tool calls as call chunks."""
    return AIMessageChunk(
        content=message.content,
        additional_kwargs=message.additional_kwargs,
        response_metadata=message.response_metadata,
        usage_metadata=message.usage_metadata,
        name=message.name,
        tool_call_chunks=[
            {
                "name": c["name"],
                "args": json.dumps(c["args"], ensure_ascii=False),
                "id": c["id"],
                "index": i,
                "type": "tool_call_chunk",
            }
            for i, c in enumerate(message.tool_calls)
        ],
    )


def bound_tool_names(kwargs: dict[str, Any]) -> list[str]:
    """Names of the tools `bind_tools` put in a request's kwargs, in order."""
    return [t["function"]["name"] for t in kwargs.get("tools", [])]
