"""`compact`: compaction as a step of its own, in graphs built with `ModelView(own_step=True)`.

Studio's graph runs it so that each compaction shows as the node's update;
any other graph compacts inside `call_model` (`nodes.compaction.policy`),
one checkpoint per round fewer. Both run the same step.
"""

from __future__ import annotations

from typing import Any, cast

from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.runtime import Runtime

from nodes.compaction.policy import compacted, compactor_of
from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.core.state import LoopState
from nodes.kernel.compat import sync_node
from nodes.token_accounting.aside import add_aside, measured
from nodes.token_accounting.state import TokenUsageState


def make_compact(loop: Loop) -> Runnable[Any, Any]:
    compactor = compactor_of(loop)

    def compact(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Fold older turns into a running summary when the view would exceed its budget, and
        move what the summary covers to the transcript archive."""
        update, usage = measured(compacted, loop, compactor, env_of(runtime), state, config)
        add_aside(update, cast(TokenUsageState, state).get("token_usage"), "compaction", usage)
        return update

    return sync_node(compact, "compact")
