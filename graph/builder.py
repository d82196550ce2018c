"""`build_graph`: the loop's `StateGraph`, wired as DESIGN §3 draws it.

START → resolve_vision → compact → assemble_context → call_model
                           ↑                                │ tool calls and round < max_rounds
                           └────── dispatch_tools ←─────────┘ (one Send per call)
                                                            │ otherwise
                                              extract_memory → finish_turn → END

Stages with nothing to do (no vision describer, no token budget, no extractor,
no turn-end hook) are routed around at build time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.store.base import BaseStore
from langgraph.types import Command, Durability, Send

from memory.background import TURNS
from nodes.compact import make_compact
from nodes.compat import CONFIG_KEY_DURABILITY, RunnableCallable, reclass_compiled
from nodes.config import LoopConfig
from nodes.context import make_assemble_context
from nodes.env import SessionEnv
from nodes.extraction import make_extract_memory
from nodes.loop import Loop
from nodes.model_call import make_call_model
from nodes.state import LoopState, TurnInput
from nodes.tools import make_dispatch_tools
from nodes.transcript import pending_tool_calls
from nodes.turn_end import make_finish_turn
from nodes.vision import make_resolve_vision

VISION, COMPACT, ASSEMBLE, CALL, DISPATCH, EXTRACT, FINISH = (
    "resolve_vision",
    "compact",
    "assemble_context",
    "call_model",
    "dispatch_tools",
    "extract_memory",
    "finish_turn",
)
LOOP_NODES = (VISION, COMPACT, ASSEMBLE, CALL, DISPATCH, EXTRACT, FINISH)


def _sends(calls: list[dict]) -> list[Send]:
    # The Send carries only the call; ToolNode reads the state it needs itself,
    # which keeps the task payload O(1) instead of O(transcript).
    return [Send(DISPATCH, [call]) for call in calls]


def route_after_model(sequential: bool, turn_end: str):
    def route_after_model(state: dict) -> list[Send] | str:
        """Run the requested tool calls, or end the turn."""
        pending = pending_tool_calls(state["messages"])
        if not pending:
            return turn_end
        return _sends(pending[:1] if sequential else pending)

    return route_after_model


def fixed_route(target: str):
    """A router that always picks `target` (the stages that are on decide it at build time)."""

    def route(state: dict) -> str:
        return target

    return route


def route_after_tools(next_stage: str):
    def route_after_tools(state: dict) -> list[Send] | str:
        """Sequential mode: the next call of the batch, in order, or back to the model."""
        pending = pending_tool_calls(state["messages"])
        return _sends(pending[:1]) if pending else next_stage

    return route_after_tools


class NothingToResumeError(ValueError):
    """`invoke(None, thread)` on a thread with no interrupted turn."""


def check_turn_input(input: Any) -> None:
    """A new turn must bring at least one message (a `Command` or `None` resumes instead)."""
    if input is None or isinstance(input, Command):
        return
    messages = input.get("messages") if isinstance(input, dict) else None
    if not messages:
        raise ValueError("turn input: 'messages' must hold at least one message")


def _nothing_to_resume(config: RunnableConfig | None) -> NothingToResumeError:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return NothingToResumeError(
        f"thread {thread!r} has no interrupted turn to resume; send a message to start one"
    )


class CyreneGraph(CompiledStateGraph):
    """The compiled loop. It checks a run's input at the boundary, so an empty
    turn or a resume with nothing to resume fails with a plain `ValueError`
    before any node runs; it runs with `LoopConfig.durability` unless told
    otherwise; and it tells background work when turns run. Everything else
    is LangGraph's."""

    def __init__(self, *, default_durability: Durability = "sync", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.default_durability = default_durability

    @property
    def _saves_itself(self) -> bool:
        """Whether this graph holds its own saver; otherwise a parent, Studio or nobody saves."""
        return isinstance(self.checkpointer, BaseCheckpointSaver)

    def _run_kwargs(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Fill in our durability unless the run or a parent graph chose one, or nothing saves.

        `checkpoint_during` is LangGraph's deprecated spelling and excludes `durability`."""
        chosen = (
            not self._saves_itself
            or kwargs.get("durability") is not None
            or kwargs.get("checkpoint_during") is not None
            or CONFIG_KEY_DURABILITY in ((config or {}).get("configurable") or {})
        )
        return kwargs if chosen else {**kwargs, "durability": self.default_durability}

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator:
        check_turn_input(input)
        # Without a saver of its own (Studio injects one per run) LangGraph decides.
        if input is None and self._saves_itself and not self._resumable(config or {}):
            raise _nothing_to_resume(config)
        return self._as_turn(super().stream(input, config, **self._run_kwargs(config, kwargs)))

    def _resumable(self, config: RunnableConfig) -> bool:
        # A crash can land after a task's writes were saved but before the next
        # checkpoint was: `next` is then empty, yet LangGraph resumes from the writes.
        saved = self.checkpointer.get_tuple(config)
        return saved is not None and bool(saved.pending_writes or self.get_state(config).next)

    async def _aresumable(self, config: RunnableConfig) -> bool:
        saved = await self.checkpointer.aget_tuple(config)
        return saved is not None and bool(
            saved.pending_writes or (await self.aget_state(config)).next
        )

    @staticmethod
    def _as_turn(chunks: Iterator) -> Iterator:
        with TURNS.turn():
            yield from chunks

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator:
        check_turn_input(input)
        if input is None and self._saves_itself and not await self._aresumable(config or {}):
            raise _nothing_to_resume(config)
        with TURNS.turn():
            async for chunk in super().astream(input, config, **self._run_kwargs(config, kwargs)):
                yield chunk


def build_graph(
    config: LoopConfig,
    checkpointer: BaseCheckpointSaver | None = None,
    *,
    store: BaseStore | None = None,
    name: str = "cyrene",
) -> CompiledStateGraph:
    """Compile the loop for `config`; pass a saver from `open_checkpointer` for durable sessions."""
    loop = Loop.from_config(config)
    sequential = config.tool_execution == "sequential"
    graph: StateGraph[Any, SessionEnv, Any, Any] = StateGraph(
        LoopState, context_schema=SessionEnv, input_schema=TurnInput
    )
    graph.add_node(VISION, make_resolve_vision(loop))
    graph.add_node(COMPACT, make_compact(loop))
    graph.add_node(ASSEMBLE, make_assemble_context(loop))
    graph.add_node(CALL, RunnableCallable(*make_call_model(loop), name=CALL, trace=False))
    graph.add_node(DISPATCH, make_dispatch_tools(loop))
    graph.add_node(EXTRACT, make_extract_memory(loop))
    graph.add_node(FINISH, make_finish_turn(loop))
    # Stages that are off are skipped rather than run as no-ops: every
    # superstep costs a checkpoint write. All nodes stay in the drawn graph.
    round_start = COMPACT if config.max_context_tokens > 0 else ASSEMBLE
    turn_start = VISION if config.vision is not None else round_start
    after_extract = FINISH if config.on_turn_end is not None else END
    extracting = config.extractor is not None and config.memory is not None
    after_reply = EXTRACT if extracting else after_extract
    graph.add_conditional_edges(START, fixed_route(turn_start), [VISION, COMPACT, ASSEMBLE])
    graph.add_conditional_edges(VISION, fixed_route(round_start), [COMPACT, ASSEMBLE])
    graph.add_edge(COMPACT, ASSEMBLE)
    graph.add_edge(ASSEMBLE, CALL)
    graph.add_conditional_edges(
        CALL, route_after_model(sequential, after_reply), [DISPATCH, EXTRACT, FINISH, END]
    )
    if sequential:
        graph.add_conditional_edges(
            DISPATCH, route_after_tools(round_start), [DISPATCH, COMPACT, ASSEMBLE]
        )
    else:
        graph.add_conditional_edges(DISPATCH, fixed_route(round_start), [COMPACT, ASSEMBLE])
    graph.add_conditional_edges(EXTRACT, fixed_route(after_extract), [FINISH, END])
    graph.add_edge(FINISH, END)
    compiled = graph.compile(checkpointer=checkpointer, store=store, name=name)
    # Tool calls of one batch run as parallel tasks of one superstep; this caps
    # them; the subclass checks input and picks durability (see CyreneGraph).
    return reclass_compiled(compiled, CyreneGraph, default_durability=config.durability).with_config(
        max_concurrency=config.tool_parallelism
    )
