"""The turn the crash and shutdown workers run: one batch of two tool calls, then a reply.

`quick_lookup` finishes at once; `slow_report` keeps working while the worker
says so, so the test can kill or stop the process inside it. Both log what
they do to a file the test reads (fsynced: a SIGKILL loses no line).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool, tool

from graph import LoopConfig, Persona
from tests.scripted import ScriptedChatModel, call, tool_calls

BATCH = tool_calls(
    call("quick_lookup", "call-1", key="k"), call("slow_report", "call-2", topic="t")
)
"""The model's first reply: both tools at once."""


def log_to(path: Path) -> Callable[[str], None]:
    """A logger that appends a line to `path` and syncs it to disk at once."""

    def log(line: str) -> None:
        with path.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    return log


def lookup_and_report(
    log: Callable[[str], None],
    working: Callable[[], bool],
    done: Callable[[], str] = lambda: "slow done",
) -> list[BaseTool]:
    """The two tools: `slow_report` logs `slow start`, works while `working()`, then logs `done()`."""

    @tool
    def quick_lookup(key: str) -> str:
        """Fast."""
        log(f"quick {key}")
        return f"value of {key}"

    @tool
    def slow_report(topic: str) -> str:
        """Slow: keeps working while the worker says so."""
        log("slow start")
        while working():
            time.sleep(0.02)
        log(done())
        return f"report on {topic}"

    return [quick_lookup, slow_report]


def final(messages: Sequence[BaseMessage]) -> AIMessage:
    """The model's last reply: what the tools returned."""
    results = [str(m.content) for m in messages if m.type == "tool"]
    return AIMessage("都查好了：" + "，".join(results))


def worker_config(script: list[Any], tools: list[BaseTool], **options: Any) -> LoopConfig:
    """The workers' loop: one persona, the scripted model, the two tools."""
    return LoopConfig(
        model=ScriptedChatModel(script=script),
        personas={"xilian": Persona(name="昔涟", instructions="你是昔涟。")},
        default_persona="xilian",
        tools=tools,
        **options,
    )


def sent_line(messages: Sequence[BaseMessage]) -> str:
    """`sent type:call-id | …`: what the model's last request held, for the test to check."""
    return "sent " + " | ".join(f"{m.type}:{getattr(m, 'tool_call_id', '')}" for m in messages)
