"""Reading a transcript (a list of LangChain messages): the bottom of the layers.

No LangGraph imports and nothing of the loop's: extractors (here in `memory`)
and every layer above read messages through these two functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage, HumanMessage


def message_text(message: BaseMessage) -> str:
    """The message's text parts joined by spaces.

    Images, reasoning and other non-text blocks are ignored, so this is the
    view used for retrieval queries, guards and hooks.
    """
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return " ".join(p for p in parts if p)


def last_human(messages: Sequence[BaseMessage]) -> HumanMessage | None:
    """The inbound message of the current turn, if any."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message
    return None
