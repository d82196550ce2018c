"""Every private or Beta API of LangGraph and LangChain that the loop relies on.

Nothing else in the project reaches into `langgraph._internal` or calls an
underscore method of a dependency: when an upgrade moves one of these, this
package (here, and `savers.py` for the checkpoint savers' internals) and
`tests/test_compat.py` are the only places that change, and that
test names what moved. `pyproject.toml` pins `langgraph` to the minor versions
the tests cover for the same reason (`DeltaChannel` is Beta).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from langchain_core.runnables import Runnable, RunnableConfig
from langgraph._internal._constants import (
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_READ,
    CONFIG_KEY_RUNTIME,
    CONFIG_KEY_TASK_ID,
    NS_SEP,
)
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.types import _DeltaSnapshot as DeltaSnapshot

from nodes.kernel.lazy import lazy_exports

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph._internal._runnable import RunnableCallable as RunnableCallable
    from langgraph.channels.delta import DeltaChannel as DeltaChannel
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.pregel._retry import _should_retry_on as retry_policy_retries

# LangGraph's graph machinery takes most of a second to import; a reader of stored
# sessions (`cyrene history`) needs only the checkpoint names above.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DeltaChannel": "langgraph.channels.delta",
        "RunnableCallable": "langgraph._internal._runnable",
        "retry_policy_retries": "langgraph.pregel._retry:_should_retry_on",
    },
)

__all__ = [
    "CONFIG_KEY_DURABILITY",
    "DeltaChannel",
    "DeltaSnapshot",
    "RunnableCallable",
    "chat_model_name",
    "chat_model_provider",
    "checkpointer_of",
    "delta_channels_replayed",
    "delta_snapshots",
    "graph_namespace",
    "inside_parent_run",
    "narrow_route_reads",
    "parent_context",
    "reads_nothing",
    "reclass_compiled",
    "retry_policy_retries",
    "routes_to",
    "sync_node",
    "write_fixed_start",
]

CompiledT = TypeVar("CompiledT", bound="CompiledStateGraph[Any, Any, Any, Any]")
RunnableT = TypeVar("RunnableT", bound=Runnable[Any, Any])


def reclass_compiled(
    compiled: CompiledStateGraph[Any, Any, Any, Any], cls: type[CompiledT], **extra: Any
) -> CompiledT:
    """`compiled` re-made as an instance of the subclass `cls`, with `extra` init arguments.

    `CompiledStateGraph.copy` does the same inside LangGraph: a compiled graph
    is rebuilt from its attributes (`__orig_class__` is typing's, not an init
    argument).
    """
    attrs = {k: v for k, v in compiled.__dict__.items() if k != "__orig_class__"}
    return cls(**attrs, **extra)


READS_NOTHING = "_cyrene_reads_nothing"
"""The attribute `reads_nothing` sets on a route."""


def reads_nothing(route: RunnableT) -> RunnableT:
    """Mark a conditional edge's path as reading no state (`narrow_route_reads`)."""
    setattr(route, READS_NOTHING, True)
    return route


ROUTES_TO = "_cyrene_routes_to"
"""The attribute `routes_to` sets on a route: the one node it always picks."""


def routes_to(route: RunnableT, target: str) -> RunnableT:
    """Mark a conditional edge's path as always picking `target` (`write_fixed_start`)."""
    setattr(route, ROUTES_TO, target)
    return route


def write_fixed_start(compiled: CompiledStateGraph[Any, Any, Any, Any]) -> None:
    """A conditional edge from START marked `routes_to` publishes as LangGraph's plain
    edge does, with a `ChannelWrite`, and still declares every node it could reach.

    As a route it makes `__start__` a sequence (its input's write, then the route),
    and LangGraph runs a sequence's first step as a task of its own and ends it with
    shielded callbacks: two more waits on the event loop per turn, which 50 sessions
    on one loop feel. A `ChannelWrite` merges with the input's (`PregelNode.flat_writers`).
    Only START's: the drawing runs every `ChannelWrite` of a node it reaches, and
    START is the one node it reaches once, so elsewhere the fixed write would be drawn
    as a plain edge.
    """
    from langgraph.constants import START
    from langgraph.pregel._write import ChannelWrite, ChannelWriteTupleEntry

    node = compiled.nodes[START]
    for branch in compiled.builder.branches.get(START, {}).values():
        target = getattr(branch.path, ROUTES_TO, None)
        if target is None:
            continue
        for i, writer in enumerate(node.writers):
            if getattr(writer, "func", None) != branch._route:
                continue
            # The route's own writer names the channel (none for END).
            routed = cast(Any, writer).kwargs["writer"]([target])
            writes = _always([(entry.channel, entry.value) for entry in routed])
            declared = ChannelWrite.get_static_writes(writer)
            node.writers[i] = ChannelWrite((ChannelWriteTupleEntry(writes, static=declared),))
    for cached in ("flat_writers", "node"):  # PregelNode's cached properties
        node.__dict__.pop(cached, None)


def _always(writes: list[tuple[str, Any]]) -> Callable[[Any], list[tuple[str, Any]] | None]:
    """A `ChannelWriteTupleEntry` mapper: `writes`, whatever the node returned."""

    def mapper(_: Any) -> list[tuple[str, Any]] | None:
        return writes or None

    return mapper


def narrow_route_reads(compiled: CompiledStateGraph[Any, Any, Any, Any]) -> None:
    """Each conditional edge of `compiled` reads only the channels its path's input schema
    names, and one marked `reads_nothing` reads none.

    LangGraph's reader for a route (`attach_branch`) is a fresh read
    (`pregel._algo.local_read`) that copies every channel of the graph and folds the
    node's writes into each, whatever the route selects: the transcript's list and
    its reducer once more per step. Here the same `local_read` is given only the
    selected channels; a route that reads nothing gets the node's output, as
    LangGraph gives it to a branch attached without a reader.
    """
    builder = compiled.builder
    for start, branches in builder.branches.items():
        for branch in branches.values():
            # The schema LangGraph's reader reads, chosen as `attach_branch` chooses it.
            node = builder.nodes.get(start)
            schema = branch.input_schema or (node.input_schema if node else builder.state_schema)
            if compiled.schema_to_mapper.get(schema) is not None:
                continue  # a pydantic or dataclass state: LangGraph's reader builds it
            select = list(builder.schemas[schema])
            if select == ["__root__"]:
                continue  # a root channel is read whole, as a value, not a dict
            unread = getattr(branch.path, READS_NOTHING, False)
            for writer in compiled.nodes[start].writers:
                if getattr(writer, "func", None) == branch._route:
                    cast(Any, writer).kwargs["reader"] = None if unread else _fresh_read(select)


def _fresh_read(select: list[str]) -> Callable[[RunnableConfig], Any]:
    """A route's read of `select` with its node's writes folded in, copying those channels only."""
    from langgraph.pregel._algo import local_read

    def read(config: RunnableConfig) -> Any:
        full = config["configurable"][CONFIG_KEY_READ]
        if isinstance(full, partial) and full.func is local_read and len(full.args) == 4:
            scratchpad, channels, managed, task = full.args
            only = {name: channels[name] for name in select if name in channels}
            return local_read(scratchpad, only, managed, task, select, fresh=True)
        return full(select, True)  # LangGraph changed its reader: its own, whole read

    return read


def sync_node(func: Callable[..., Any], name: str) -> Runnable[Any, Any]:
    """A sync function as a node, made as `add_node` makes one (LangGraph's private
    `coerce_to_runnable`): an async run calls it on a worker thread, never on the loop."""
    from langgraph._internal._runnable import coerce_to_runnable

    return coerce_to_runnable(func, name=name, trace=False)


def _tracing_params(model: BaseChatModel) -> dict[str, Any]:
    """`_get_ls_params`: the only place LangChain says which provider and model a chat model
    talks to ("openai", "gpt-4o-mini", …) without a live client."""
    try:
        return dict(model._get_ls_params())
    except Exception:  # a model whose params need a live client, say
        return {}


def chat_model_provider(model: BaseChatModel) -> str:
    """The provider LangChain reports for tracing (`ls_provider`), else the model's `_llm_type`."""
    return str(_tracing_params(model).get("ls_provider") or "") or model._llm_type


def chat_model_name(model: BaseChatModel) -> str:
    """The model LangChain reports for tracing (`ls_model_name`), else the model's `_llm_type`."""
    return str(_tracing_params(model).get("ls_model_name") or "") or model._llm_type


def delta_channels_replayed(saved: CheckpointTuple) -> set[str]:
    """The `DeltaChannel`s whose value at `saved` is rebuilt from its ancestors.

    Such a channel has a version but no stored value here. Its
    `counters_since_delta_snapshot` entry (Beta metadata) is non-zero at every
    checkpoint after its last snapshot, which tells it apart from a consumed
    trigger channel that also has a version and no value.
    """
    counters = saved.metadata.get("counters_since_delta_snapshot") or {}
    checkpoint = saved.checkpoint
    return {
        name
        for name in counters
        if name in checkpoint["channel_versions"] and name not in checkpoint["channel_values"]
    }


def waits_at(saved: CheckpointTuple, node: str) -> bool:
    """Whether the saved checkpoint's next step runs `node`, read without loading its state.

    LangGraph runs a node when a channel it is triggered by holds a value of a
    version the node has not seen (a consumed trigger keeps a newer version but
    no value); a graph's edges reach a node through `branch:to:<node>`.
    """
    channel = f"branch:to:{node}"
    checkpoint = saved.checkpoint
    if channel not in checkpoint["channel_values"]:
        return False
    version = checkpoint["channel_versions"].get(channel)
    seen = checkpoint["versions_seen"].get(node, {}).get(channel)
    # One saver's versions are all of one type (str, int or float), compared as Pregel does.
    return version is not None and (seen is None or cast(Any, version) > seen)


def delta_snapshots(
    saver: BaseCheckpointSaver, config: RunnableConfig, specs: dict[str, DeltaChannel]
) -> dict[str, DeltaSnapshot]:
    """The full value of each channel in `specs` at the checkpoint `config` names, as a snapshot.

    The walk LangGraph's loader does (`channels_from_checkpoint`): the nearest
    stored seed, then the ancestors' writes after it, folded by the channel's
    reducer. A `DeltaSnapshot` stored in a checkpoint's `channel_values` ends
    that walk there, so the ancestors are no longer needed.
    """
    histories = saver.get_delta_channel_history(config=config, channels=list(specs))
    snapshots = {}
    for name, spec in specs.items():
        channel = spec.from_checkpoint(histories[name].get("seed"))
        channel.replay_writes(histories[name]["writes"])
        snapshots[name] = DeltaSnapshot(channel.get())
    return snapshots


def inside_parent_run(config: RunnableConfig | None) -> bool:
    """Whether `config` is that of a task of a running graph: a subgraph call, or a node or
    tool passing its own config on (LangGraph then owns `checkpoint_ns`)."""
    return CONFIG_KEY_TASK_ID in ((config or {}).get("configurable") or {})


def parent_context(config: RunnableConfig | None) -> Any:
    """The context of the graph whose task `config` is (a parent graph running this one as
    a subgraph hands its runtime down in the config), or None."""
    runtime = ((config or {}).get("configurable") or {}).get(CONFIG_KEY_RUNTIME)
    return getattr(runtime, "context", None)


def checkpointer_of(config: RunnableConfig | None) -> BaseCheckpointSaver | None:
    """The saver a running graph's node is saved by (LangGraph hands it down in the config;
    Studio's server injects its own there too)."""
    saver = ((config or {}).get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)
    return saver if isinstance(saver, BaseCheckpointSaver) else None


def graph_namespace(config: RunnableConfig | None) -> str:
    """The checkpoint namespace of the graph a node runs in: a task's own namespace is
    the graph's, then `|`, then the task's (`compact:<task id>` for the root graph)."""
    ns = str(((config or {}).get("configurable") or {}).get("checkpoint_ns", ""))
    return ns.rpartition(NS_SEP)[0]
