"""`build_graph`: the loop's `StateGraph`, wired as the README's graph draws it.

START → resolve_vision → compact → assemble_context → call_model
                           ↑                                │ tool calls and round < max_rounds
                           └────── dispatch_tools ←─────────┘ (one Send per call)
                           ↑                                │ calls the loop answered itself
                           └────────────────────────────────┘ (cut off, unparseable)
                                                            │ otherwise
                                              extract_memory → finish_turn → END

`call_model` retries transient provider errors (its `RetryPolicy`).

With `GroupPresence(reply=...)` other than "always", a group turn starts at
`call_model`, whose first policy decides whether to answer
(`nodes.presence.policy`): a quiet turn ends there (no reply, so no turn-end
hook either: a quiet message costs a fraction of an answered turn), an answered
one goes back to the turn's first stage and then to the model.

Stages with nothing to do (no vision describer, no token budget, no extractor,
no turn-end hook) are routed around at build time (`nodes.loop.stages`), and so is
`assemble_context` unless `ModelView(own_step=True)` asks to watch each round's view:
`call_model` then assembles the view itself, one checkpoint per round fewer.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import AnyMessage, ToolCall
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore
from langgraph.types import Send

from graph.runs import CyreneGraph
from graph.sessions.settings import Sessions
from graph.storage.archive import archive_for
from nodes.compaction.node import make_compact
from nodes.context.node import make_assemble_context
from nodes.core.config import LoopConfig
from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.core.stages import (
    ASSEMBLE,
    CALL,
    COMPACT,
    DISPATCH,
    EXTRACT,
    FINISH,
    VISION,
    Stages,
)
from nodes.core.state import RunInput
from nodes.extraction.node import make_extract_memory
from nodes.kernel.compat import (
    RunnableCallable,
    narrow_route_reads,
    reads_nothing,
    reclass_compiled,
    routes_to,
    write_fixed_start,
)
from nodes.kernel.transcript import needs_another_round, pending_tool_calls
from nodes.loop.model_call import make_call_model
from nodes.loop.stages import stages_of
from nodes.loop.state import session_state
from nodes.presence.policy import after_decision
from nodes.presence.settings import PresenceRecord
from nodes.tools.node import make_dispatch_tools
from nodes.tools.settings import ToolCalls
from nodes.turn_end.node import make_finish_turn
from nodes.vision.node import make_resolve_vision
from nodes.vision.settings import Vision


def inline(router: Any, reads_state: bool = True) -> RunnableCallable:
    """A router run in place: it is pure, so an async run spends no thread hop
    (LangGraph's default for a plain function) and no trace on it. One that does not
    `reads_state` is given its step's output, not a copy of the state."""
    route = RunnableCallable(router, None, name=router.__name__, trace=False)
    return route if reads_state else reads_nothing(route)


def _sends(calls: list[ToolCall]) -> list[Send]:
    # The Send carries only the call; ToolNode reads the state it needs itself,
    # which keeps the task payload O(1) instead of O(transcript).
    return [Send(DISPATCH, [call]) for call in calls]


class TranscriptRead(TypedDict, total=False):
    """What a route after the model or a tool reads of the state: the transcript, and a
    group turn's decision (`nodes.presence.policy.after_decision`), with the step's writes
    folded in; no other channel is copied for it (`narrow_route_reads`)."""

    messages: list[AnyMessage]
    presence: PresenceRecord


def route_after_model(
    sequential: bool,
    turn_end: str,
    round_start: str,
    max_rounds: int,
    answer_at: str | None = None,
):
    def route_after_model(state: TranscriptRead) -> list[Send] | str:
        """Run the requested tool calls; after calls the loop answered itself (cut off,
        unparseable), let the model issue them again; after a group turn's decision, its
        stages or its end; otherwise end the turn."""
        if answer_at is not None and (step := after_decision(state)) is not None:
            return answer_at if step == "answer" else END
        pending = pending_tool_calls(state["messages"])
        if pending:
            return _sends(pending[:1] if sequential else pending)
        if needs_another_round(state["messages"], max_rounds):
            return round_start
        return turn_end

    return inline(route_after_model)


def fixed_route(target: str):
    """A router that always picks `target` (the stages that are on decide it at build time)."""

    def route(output: Any) -> str:
        return target

    return routes_to(inline(route, reads_state=False), target)


def group_turn_start(turn_start: str):
    """Presence on: a group turn starts at `call_model`, where it is decided whether it is
    answered at all; any other session's turn starts at `turn_start`."""

    def route_turn_start(input: Any, runtime: Runtime[SessionEnv]) -> str:
        return CALL if env_of(runtime).actor == "group" else turn_start

    return inline(route_turn_start, reads_state=False)


def route_after_tools(next_stage: str):
    def route_after_tools(state: TranscriptRead) -> list[Send] | str:
        """Sequential mode: the next call of the batch, in order, or back to the model."""
        pending = pending_tool_calls(state["messages"])
        return _sends(pending[:1]) if pending else next_stage

    return inline(route_after_tools)


def add_edges(
    graph: StateGraph[Any, SessionEnv, Any, Any], config: LoopConfig, stages: Stages
) -> None:
    """Wire the seven nodes as the README's graph draws them; every node stays in the drawing."""
    tools = config.feature(ToolCalls)
    sequential = tools.sequential
    round_starts = [COMPACT, ASSEMBLE, CALL]
    start_route = (
        group_turn_start(stages.turn_start) if stages.presence else fixed_route(stages.turn_start)
    )
    graph.add_conditional_edges(START, start_route, [VISION, *round_starts])
    graph.add_conditional_edges(VISION, fixed_route(stages.round_start), round_starts)
    graph.add_conditional_edges(COMPACT, fixed_route(stages.view), [ASSEMBLE, CALL])
    graph.add_edge(ASSEMBLE, CALL)
    answer_at = stages.turn_start if stages.presence else None  # a decided group turn's next stage
    graph.add_conditional_edges(
        CALL,
        route_after_model(
            sequential, stages.after_reply, stages.round_start, tools.max_rounds, answer_at
        ),
        [DISPATCH, *([VISION] if stages.presence else []), *round_starts, EXTRACT, FINISH, END],
    )
    after_tools = route_after_tools(stages.round_start) if sequential else None
    graph.add_conditional_edges(
        DISPATCH,
        after_tools or fixed_route(stages.round_start),
        [DISPATCH, *round_starts] if sequential else round_starts,
    )
    graph.add_conditional_edges(EXTRACT, fixed_route(stages.after_extract), [FINISH, END])
    graph.add_edge(FINISH, END)


def build_graph(
    config: LoopConfig,
    checkpointer: BaseCheckpointSaver | None = None,
    *,
    store: BaseStore | None = None,
    name: str = "cyrene",
) -> CyreneGraph:
    """Compile the loop for `config` into a LangGraph graph.

    Every stage of the loop is a node; stages that `config` switches off are
    routed around (each superstep costs a checkpoint) but stay in the drawing.

    Args:
        config: the loop's settings; already validated when it was built.
        checkpointer: a saver from `open_checkpointer` (or any LangGraph saver)
            for sessions that survive the process; `None` keeps no history, as
            LangGraph Studio wants (it brings its own).
        store: a LangGraph `BaseStore`, passed through to `compile`.
        name: the graph's name in traces and Studio.

    Returns:
        A `CyreneGraph`: a compiled graph whose `invoke`/`ainvoke`/`stream`/
        `astream` admit each run at the boundary first.

    Raises:
        ValueError: a chat model named by a `"provider:model"` string cannot
            be loaded (missing package or key), naming the field.

    Example:
        >>> with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        ...     graph = build_graph(LoopConfig(model=model), checkpointer=saver)
        ...     graph.invoke({"messages": [HumanMessage("早安")]},
        ...                  {"configurable": {"thread_id": "s1"}},
        ...                  context=SessionEnv(actor="owner"))
    """
    loop, stages = Loop.from_config(config, archives=archive_for), stages_of(config)
    graph: StateGraph[Any, SessionEnv, Any, Any] = StateGraph(
        session_state(config.middleware), context_schema=SessionEnv, input_schema=RunInput
    )
    graph.add_node(VISION, make_resolve_vision(loop))
    graph.add_node(COMPACT, make_compact(loop))
    graph.add_node(ASSEMBLE, make_assemble_context(loop))
    graph.add_node(CALL, make_call_model(loop, stages), retry_policy=config.retry)
    graph.add_node(DISPATCH, make_dispatch_tools(loop))
    graph.add_node(EXTRACT, make_extract_memory(loop))
    graph.add_node(FINISH, make_finish_turn(loop))
    add_edges(graph, config, stages)
    compiled = graph.compile(checkpointer=checkpointer, store=store, name=name)
    write_fixed_start(compiled)
    narrow_route_reads(compiled)
    # Tool calls of one batch run as parallel tasks of one superstep; this caps
    # them; the subclass checks input and picks durability (see CyreneGraph).
    sessions = config.feature(Sessions)
    return reclass_compiled(
        compiled,
        CyreneGraph,
        default_durability=config.durability,
        busy_policy=sessions.busy_policy,
        busy_timeout=sessions.busy_timeout,
        max_image_bytes=config.feature(Vision).max_image_bytes,
        trace_facts=loop.trace_facts,
        records_turns=config.extractor is not None and config.memory is not None,
        persona_of=loop.persona_for,
        clock=loop.now,
    ).with_config(max_concurrency=config.feature(ToolCalls).parallelism)
