"""A chat model whose reply is computed, not called: the base of the loop's thinking gate
(`nodes.thinking.policy`) and of the offline models (`studio.demo.offline_model`).

`BaseChatModel` asks a subclass for `_generate` and `_stream`, which wrap
messages in LangChain's result types; here a subclass says only what the reply
is (`reply`) and, if it streams in pieces, what the pieces are (`stream_reply`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

Messages = list[BaseMessage]
RunManager = CallbackManagerForLLMRun | None
Kwargs = dict[str, Any]
"""The request's bound parameters (tools among them)."""


class ReplyChatModel(BaseChatModel):
    """A chat model whose reply to `messages` is `reply(messages, run_manager, kwargs)`."""

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """What tracing reports of the model (LangChain's standard params): its own
        `_llm_type` as the model's name, under the `cyrene` provider."""
        return LangSmithParams(
            ls_provider="cyrene", ls_model_name=self._llm_type, ls_model_type="chat"
        )

    def reply(self, messages: Messages, run_manager: RunManager, kwargs: Kwargs) -> BaseMessage:
        """The whole reply."""
        raise NotImplementedError

    def stream_reply(
        self, messages: Messages, run_manager: RunManager, kwargs: Kwargs
    ) -> Iterator[AIMessageChunk]:
        """The reply in pieces: by default in one, as a model that does not stream."""
        reply = self.reply(messages, run_manager, kwargs)
        yield as_chunk(reply if isinstance(reply, AIMessage) else AIMessage(reply.content))

    def _generate(
        self,
        messages: Messages,
        stop: list[str] | None = None,
        run_manager: RunManager = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(
            generations=[ChatGeneration(message=self.reply(messages, run_manager, kwargs))]
        )

    def _stream(
        self,
        messages: Messages,
        stop: list[str] | None = None,
        run_manager: RunManager = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self.stream_reply(messages, run_manager, kwargs):
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
