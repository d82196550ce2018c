"""`assemble_context`: publish this round's model view as a step of its own.

Only in graphs built with `ModelView(own_step=True)` (Studio's): the view is
then that node's update, visible in Studio and `stream_mode="updates"`;
otherwise `call_model` assembles the same view itself (`nodes.context.assemble`).
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from nodes.context.assemble import view_blocks, view_of_state
from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.core.state import LoopState
from nodes.kernel.compat import RunnableCallable
from nodes.kernel.steps import off_loop


def make_assemble_context(loop: Loop) -> RunnableCallable:
    """The `assemble_context` node: publishes this round's model view."""
    hops = view_blocks(loop)

    def assemble_context(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Build the model's view for this round (instructions, time, memories, attribution)."""
        return {"model_view": view_of_state(loop, env_of(runtime), state, config=config)}

    async def aassemble_context(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Build the model's view for this round (instructions, time, memories, attribution)."""
        return await off_loop(hops, assemble_context, state, config, runtime)

    return RunnableCallable(
        assemble_context, aassemble_context, name="assemble_context", trace=False
    )
