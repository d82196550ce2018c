"""`compact`: keep the model view under `max_context_tokens` by folding older turns.

Runs every round before `assemble_context`. The estimate is the view exactly
as it will be sent (attribution notes and `transform_context` included) except
the memory block, which is bounded by `memory_k`; searching twice per round
would double the retrieval cost. A compactor that fails or
returns nothing is logged and the round goes on uncompacted.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from nodes.env import SessionEnv, env_of
from nodes.loop import Loop
from nodes.state import LoopState
from nodes.view.assemble import view_of_state
from nodes.view.attribution import describe_speaker
from nodes.view.compaction import StructuralCompactor, plan_cut, token_counter, uncovered_start

log = logging.getLogger("cyrene.compaction")


def make_compact(loop: Loop):
    count = token_counter(loop.default_model)
    compactor = loop.config.compactor or StructuralCompactor()

    def compact(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Fold older turns into a running summary when the view would exceed max_context_tokens."""
        budget = loop.config.max_context_tokens
        if budget <= 0:
            return {}
        env, messages, summary = env_of(runtime), state["messages"], state.get("summary")
        if count(view_of_state(loop, env, state, with_memory=False)) <= budget:
            return {}
        persona_id = loop.persona_for(env)
        start = uncovered_start(messages, summary)
        # Only messages after the summary can move; earlier ones are never re-counted.
        sizes = [0] * start + [count([m]) for m in messages[start:]]
        cut = plan_cut(messages, start, budget // 2, sizes)
        if cut is None:
            return {}
        describe = partial(
            describe_speaker,
            restricted=env.restricted,
            current=persona_id,
            display_name=loop.display_name,
        )
        try:
            text = compactor.compact(
                messages[start:cut], summary["text"] if summary else None, budget // 4, describe
            )
        except Exception:
            log.exception("compactor failed; this round goes on uncompacted")
            return {}
        if not text or not text.strip():
            log.warning("compactor returned nothing; this round goes on uncompacted")
            return {}
        return {"summary": {"text": text.strip(), "upto": messages[cut - 1].id}}

    return compact
