"""The boundary: what a run may bring in, checked once, before any node runs.

Everything past this point trusts its input. A run that brings something no
provider could render, or that would poison the session for later turns, is
refused here with a `ValueError`/`TypeError` that names the problem — and
nothing of it is stored.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command


def admit(input: Any, config: RunnableConfig | None, context: Any) -> tuple[Any, Any]:
    """The run's input and context as the loop may take them, or an exception.

    `None` and a `Command` resume an interrupted turn; anything else starts a
    new turn and must bring at least one message.
    """
    if input is None or isinstance(input, Command):
        return input, context
    messages = input.get("messages") if isinstance(input, dict) else None
    if not messages:
        raise ValueError("turn input: 'messages' must hold at least one message")
    return input, context
