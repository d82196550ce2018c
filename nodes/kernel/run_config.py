"""What a run's `RunnableConfig` says about its session, read one way everywhere.

LangGraph keeps the thread, checkpoint namespace and checkpoint id under
`config["configurable"]`, and a caller may pass no config, or one without
that key, or with it set to None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig


def configurable(config: RunnableConfig | None) -> Mapping[str, Any]:
    """The run's `configurable` mapping; empty when the caller gave none."""
    return (config or {}).get("configurable") or {}


def thread_id(config: RunnableConfig | None) -> str | None:
    """The run's thread id (where the session's checkpoints live), if it has one."""
    thread = configurable(config).get("thread_id")
    return None if thread is None else str(thread)
