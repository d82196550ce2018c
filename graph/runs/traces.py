"""The session's facts on a run's trace: every LangChain run of a turn, and every edit of
a thread's state from outside a turn, carries them in its metadata.

Kept apart from the run's steps because it is pure config shaping (`Loop.trace_facts`
decides the facts; `graph.tracing` turns them into span attributes), used by the turn,
by the dead turn finished before it (`graph.runs.claims`) and by `update_state`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig

from nodes.core.env import SessionEnv
from nodes.core.loop import TRACE_ACTOR, TRACE_SESSION, UNBOUND_ACTOR
from nodes.kernel.run_config import thread_id

TraceFacts = Callable[[SessionEnv, RunnableConfig | None], dict[str, Any]]
"""What a trace of a run says about its session (`nodes.core.loop.Loop.trace_facts`)."""


def traced(
    trace_facts: TraceFacts | None, config: RunnableConfig | None, context: Any
) -> RunnableConfig | None:
    """`config` with the session's facts in its metadata (`Loop.trace_facts`): every
    LangChain run of the turn inherits them, so a trace tells sessions apart."""
    if trace_facts is None or not isinstance(context, SessionEnv):
        return config
    return _with_metadata(config, trace_facts(context, config))


def edit_traced(
    trace_facts: TraceFacts | None, config: RunnableConfig, actor: str | None
) -> RunnableConfig:
    """An `update_state` config with the thread's facts: its actor, or `UNBOUND_ACTOR`
    before any turn opened it (so a trace keeps none of its text either way)."""
    if trace_facts is None:
        return config
    if actor is None:
        facts = {TRACE_SESSION: thread_id(config), TRACE_ACTOR: UNBOUND_ACTOR}
    else:
        facts = trace_facts(SessionEnv.model_validate({"actor": actor}), config)
    return _with_metadata(config, facts) or config


def _with_metadata(config: RunnableConfig | None, facts: dict[str, Any]) -> RunnableConfig:
    """`config` with `facts` first in its metadata (a trace attribute cut at a length limit
    still names the session and its actor)."""
    given = {k: v for k, v in (config or {}).get("metadata", {}).items() if k not in facts}
    return {**(config or {}), "metadata": {**facts, **given}}
