"""A scripted chat model that records what it is sent — the only fake besides time.

Each reply is an `AIMessage` or a function of the messages it was sent; every
request (messages, bound tools, provider kwargs) is recorded so tests can
assert exactly what the model saw.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from pydantic import Field, PrivateAttr

from studio.demo.offline_model import OfflineChatModel, as_chunk, bound_tool_names

Reply = AIMessage | Callable[[list[BaseMessage]], AIMessage]


@dataclass
class Request:
    messages: list[BaseMessage]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        return bound_tool_names(self.kwargs)

    @property
    def texts(self) -> list[tuple[str, str]]:
        """(type, text) pairs: the shape tests compare against."""
        return [
            (
                m.type,
                m.content
                if isinstance(m.content, str)
                else json.dumps(m.content, ensure_ascii=False),
            )
            for m in self.messages
        ]


def call(name: str, call_id: str, **args: Any) -> dict:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def tool_calls(*calls: dict, text: str = "") -> AIMessage:
    return AIMessage(text, tool_calls=list(calls))


class ScriptedChatModel(OfflineChatModel):
    """Replies from a script; `provider` sets the family LangChain reports for tracing."""

    script: list[Any] = Field(default_factory=list)
    provider: str = "scripted"
    stream_chunks: bool = False
    delay: float = 0.0
    _requests: list[Request] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _position: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return f"{self.provider}-scripted"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        return {"ls_provider": self.provider, "ls_model_name": "scripted", "ls_model_type": "chat"}

    @property
    def requests(self) -> list[Request]:
        return list(self._requests)

    def _next(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        with self._lock:
            self._requests.append(Request(list(messages), dict(kwargs)))
            if self._position >= len(self.script):
                raise AssertionError(f"script exhausted after {self._position} replies")
            reply = self.script[self._position]
            self._position += 1
        if self.delay:
            time.sleep(self.delay)
        message = reply(list(messages)) if callable(reply) else reply
        return message.model_copy(deep=True)

    def reply_to(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        return self._next(messages, kwargs)

    def chunks(self, message: AIMessage) -> Iterator[AIMessageChunk]:
        """With `stream_chunks`, text a character at a time, then kwargs, then calls, then
        usage; else one chunk carrying the whole reply (not a streaming model)."""
        if not self.stream_chunks:
            yield as_chunk(message)
            return
        blocks = (
            message.content
            if isinstance(message.content, list)
            else [{"type": "text", "text": message.content}]
        )
        for index, block in enumerate(blocks):
            if block.get("type") == "text":
                for char in block["text"]:
                    yield AIMessageChunk([{"type": "text", "text": char, "index": index}])
            else:
                yield AIMessageChunk([{**block, "index": index}])
        if message.additional_kwargs:
            yield AIMessageChunk("", additional_kwargs=message.additional_kwargs)
        if message.tool_calls:
            yield as_chunk(AIMessage("", tool_calls=message.tool_calls))
        if message.usage_metadata:  # providers report usage in the stream's last chunk
            yield AIMessageChunk("", usage_metadata=message.usage_metadata)
