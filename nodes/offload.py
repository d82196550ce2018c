"""Which work of an async turn leaves the event loop: only what can block.

An async run hands work that may block (a Chroma search, a user's hook, sink,
guard or `transform_context`) to a worker thread, and runs everything else
right on the event loop. A hop costs two thread switches, a GIL hand-off and a
place in the loop's default executor (min(32, cores + 4) threads: 6 on 2
cores); with dozens of sessions in flight that queue, not the work, sets the
turn rate. The predicates read the config once, at build time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import run_in_executor

if TYPE_CHECKING:
    from nodes.config import LoopConfig

T = TypeVar("T")


def view_blocks(config: LoopConfig) -> bool:
    """Assembling a view searches memory and runs `transform_context`."""
    return config.memory is not None or config.transform_context is not None


def plan_blocks(config: LoopConfig) -> bool:
    """Planning a round may assemble a view (a resumed round has none yet), run
    request guards, the `after_batch` hook and the capacity sink."""
    hooks = config.hooks
    return (
        view_blocks(config)
        or bool(config.guards)
        or hooks.after_batch is not None
        or config.on_capacity is not None
    )


def finish_blocks(config: LoopConfig) -> bool:
    """Finishing a round runs response guards and the `before_batch` hook."""
    return bool(config.guards) or config.hooks.before_batch is not None


def policy_blocks(config: LoopConfig) -> bool:
    """Vetting a tool call runs the audit sink and the `before_call` hook."""
    return config.on_audit is not None or config.hooks.before_call is not None


def report_blocks(config: LoopConfig) -> bool:
    """Reporting a tool call runs the `after_call` hook."""
    return config.hooks.after_call is not None


async def off_loop(blocks: bool, config: RunnableConfig, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`: on a worker thread when it may block, else here on the event loop."""
    if blocks:
        return await run_in_executor(config, fn, *args)
    return fn(*args)
