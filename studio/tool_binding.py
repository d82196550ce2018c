"""The one `bind_tools` the offline chat models share (the demo model and the tests' script).

A `BaseChatModel` has no `bind_tools` of its own; a real provider binds its
own tool schema. The offline models need only the OpenAI function shape, which
they read back to see which tools they were offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool


class ToolBindingChatModel(BaseChatModel):
    """A chat model whose `bind_tools` binds the tools as OpenAI function schemas."""

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def bound_tool_names(kwargs: dict[str, Any]) -> list[str]:
    """Names of the tools `bind_tools` put in a request's kwargs, in order."""
    return [t["function"]["name"] for t in kwargs.get("tools", [])]
