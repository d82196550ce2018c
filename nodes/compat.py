"""Every private or Beta API of LangGraph and LangChain that the loop relies on.

Nothing else in the project reaches into `langgraph._internal` or calls an
underscore method of a dependency: when an upgrade moves one of these, this
file and `tests/test_compat.py` are the only places that change, and that
test names what moved. `pyproject.toml` pins `langgraph` to the minor versions
the tests cover for the same reason (`DeltaChannel` is Beta).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import (
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_TASK_ID,
    NS_SEP,
)
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    writes_sort_key,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot as DeltaSnapshot
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite._delta import (
    DELTA_STAGE1_SQL,
    build_delta_channels_writes_history,
    build_delta_stage2_sql,
)

from memory.lazy import lazy_exports

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
    "IncrementalMemorySaver",
    "IncrementalSqliteSaver",
    "RunnableCallable",
    "chat_model_provider",
    "checkpointer_of",
    "delta_channels_replayed",
    "delta_snapshots",
    "graph_namespace",
    "incremental_postgres_saver",
    "inside_parent_run",
    "reclass_compiled",
    "retry_policy_retries",
]

CompiledT = TypeVar("CompiledT", bound="CompiledStateGraph[Any, Any, Any, Any]")


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


def chat_model_provider(model: BaseChatModel) -> str:
    """The provider LangChain reports for tracing (`ls_provider`), else the model's `_llm_type`.

    `_get_ls_params` is the only place LangChain says which provider a chat
    model talks to ("openai", "anthropic", …) without a live client.
    """
    try:
        name = str(model._get_ls_params().get("ls_provider") or "")
    except Exception:  # a model whose params need a live client, say
        name = ""
    return name or model._llm_type


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


History = Mapping[str, DeltaChannelHistory]
Known = tuple[str, History]
"""A checkpoint id and the `DeltaChannel` histories loaded at it."""


class _KnownHistories:
    """What the incremental savers share: each thread's last loaded history (the newest
    `capacity` threads), and a load that walks back only to it (`_since`, at most
    `max_walk` checkpoints) before falling back to LangGraph's own walk."""

    capacity = 1024
    max_walk = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: OrderedDict[tuple[Any, str], Known] = OrderedDict()
        self._last_lock = threading.Lock()

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> History:
        key = (config["configurable"]["thread_id"], config["configurable"].get("checkpoint_ns", ""))
        target = get_checkpoint_id(config) or self._latest_id(config, key)
        with self._last_lock:
            known = self._last.get(key)
        history = None
        if target and channels and known is not None and set(channels) <= known[1].keys():
            history = known[1] if known[0] == target else self._since(key, target, known)
        if history is None:
            history = super().get_delta_channel_history(  # type: ignore[misc]
                config=config, channels=channels
            )
        if target:
            with self._last_lock:
                self._last[key] = (target, history)
                self._last.move_to_end(key)
                if len(self._last) > self.capacity:
                    self._last.popitem(last=False)
        return {c: {**history[c], "writes": list(history[c]["writes"])} for c in channels}

    def _latest_id(self, config: RunnableConfig, key: tuple[Any, str]) -> str | None:
        raise NotImplementedError

    def _since(self, key: tuple[Any, str], target: str, known: Known) -> History | None:
        """The history at `target`, walking back only to `known`'s checkpoint; None when the
        walk does not reach it cleanly (LangGraph's own walk then loads it)."""
        raise NotImplementedError

    def delete_thread(self, thread_id: str) -> None:
        super().delete_thread(thread_id)  # type: ignore[misc]
        with self._last_lock:
            for key in [k for k in self._last if str(k[0]) == str(thread_id)]:
                del self._last[key]


class IncrementalMemorySaver(_KnownHistories, InMemorySaver):
    """LangGraph's `InMemorySaver`, whose `DeltaChannel` loads cost what changed since the last.

    Loading a checkpoint rebuilds the transcript from the nearest snapshot and
    the writes of every checkpoint after it (up to 100 updates, two a turn),
    and `InMemorySaver` deserialises that whole chain on every load. This saver
    keeps each thread's last history (the newest `capacity` threads) and walks
    back only to it: the next turn's load reads that turn's few checkpoints.
    Any other load (an older checkpoint, a fork, a walk longer than
    `max_walk`) is LangGraph's own.
    """

    def _latest_id(self, config: RunnableConfig, key: tuple[Any, str]) -> str | None:
        return max(self.storage.get(key[0], {}).get(key[1], {}), default=None)

    def _since(self, key: tuple[Any, str], target: str, known: Known) -> History | None:
        """Walking the ancestors as LangGraph does (a stored snapshot ends a channel's walk,
        after that checkpoint's own writes), but ending at `known`'s checkpoint."""
        stored = self.storage.get(key[0], {}).get(key[1], {})
        newer: dict[str, list] = {c: [] for c in known[1]}
        seeds: dict[str, Any] = {}
        entry = stored.get(target)
        current = entry[2] if entry is not None else None
        for _ in range(self.max_walk):
            if current is None or current not in stored:
                return None
            versions = self.serde.loads_typed(stored[current][0]).get("channel_versions", {})
            open_channels = [c for c in newer if c not in seeds]
            for channel in open_channels:
                blob = self.blobs.get((*key, channel, versions.get(channel)))
                if blob is not None and blob[0] != "empty":
                    seeds[channel] = self.serde.loads_typed(blob)
            for task, channel, value, _ in reversed(self._ordered_writes(*key, current)):
                if channel in open_channels:
                    newer[channel].append((task, channel, self.serde.loads_typed(value)))
            if len(seeds) == len(newer):
                return {c: {"seed": seeds[c], "writes": newer[c][::-1]} for c in newer}
            if current == known[0]:
                history: dict[str, DeltaChannelHistory] = {}
                for channel, writes in newer.items():
                    if channel in seeds:
                        history[channel] = {"seed": seeds[channel], "writes": writes[::-1]}
                    else:
                        old = known[1][channel]
                        history[channel] = {**old, "writes": [*old["writes"], *writes[::-1]]}
                return history
            current = stored[current][2]
        return None


class IncrementalSqliteSaver(_KnownHistories, SqliteSaver):
    """LangGraph's `SqliteSaver`, whose `DeltaChannel` loads read what changed since the last.

    LangGraph's own load walks back to the channel's last snapshot (up to 100
    updates) and deserialises every message written since, on every turn: in a
    long session that is most of a turn's CPU. This saver keeps each thread's
    last history in the process (the newest `capacity` threads) and walks the
    database only back to it, reading the few new checkpoints' writes. A walk
    that meets a snapshot, passes `max_walk` checkpoints or loses the chain (a
    pruned ancestor) is LangGraph's own. The rows are immutable once written,
    so a history known for a checkpoint stays true, whichever process wrote it.
    """

    def _latest_id(self, config: RunnableConfig, key: tuple[Any, str]) -> str | None:
        saved = self.get_tuple(config)
        return get_checkpoint_id(saved.config) if saved is not None else None

    def _since(self, key: tuple[Any, str], target: str, known: Known) -> History | None:
        """`known`'s history plus the writes of the checkpoints from `known`'s up to
        `target`'s parent; None past a snapshot (once per `snapshot_frequency` updates)."""
        thread, namespace, channels = str(key[0]), key[1], list(known[1])
        chain: list[str] = []
        with self.cursor(transaction=False) as cur:
            cur.execute(DELTA_STAGE1_SQL, (thread, namespace, target, thread, namespace))
            for cid, type_tag, blob in cur:
                if cid == target and not chain:
                    chain.append(cid)  # the target itself: its own writes are not its history
                    continue
                if cid in chain or len(chain) > self.max_walk:
                    return None
                chain.append(cid)
                values = self.serde.loads_typed((type_tag, blob)).get("channel_values") or {}
                if any(channel in values for channel in channels):
                    return None  # a snapshot on the way: LangGraph's walk starts from it
                if cid == known[0]:
                    break
            else:
                return None
            walked = chain[1:]
            cur.execute(
                build_delta_stage2_sql(
                    has_task_path=self._has_task_path, chain_lens=[len(walked)] * len(channels)
                ),
                [value for channel in channels for value in (thread, namespace, channel, *walked)],
            )
            rows = cur.fetchall()
        newer = build_delta_channels_writes_history(
            channels=channels,
            chain_by_ch={channel: walked for channel in channels},
            seed_val_by_ch={},
            seeded=set(),
            stage2_rows=rows,
            serde=self.serde,
        )
        return {
            c: {**known[1][c], "writes": [*known[1][c]["writes"], *newer[c]["writes"]]}
            for c in channels
        }


POSTGRES_CHAIN_SQL = """
WITH RECURSIVE chain AS (
    SELECT checkpoint_id, parent_checkpoint_id, checkpoint -> 'channel_values' AS vals, 0 AS depth
    FROM checkpoints WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
        AND checkpoint_id = %(target)s
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint -> 'channel_values', chain.depth + 1
    FROM chain JOIN checkpoints c ON c.thread_id = %(thread)s AND c.checkpoint_ns = %(ns)s
        AND c.checkpoint_id = chain.parent_checkpoint_id
    WHERE chain.checkpoint_id <> %(known)s AND chain.depth <= %(max_walk)s
)
SELECT checkpoint_id, vals ?| %(channels)s AS seeded FROM chain ORDER BY depth
"""
"""The target's ancestors, nearest first, down to the known checkpoint: each one's id and
whether it stores a value (a snapshot) of one of the channels."""
POSTGRES_WRITES_SQL = """
SELECT checkpoint_id, channel, task_id, idx, type, blob, task_path FROM checkpoint_writes
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND channel = ANY(%(channels)s)
    AND checkpoint_id = ANY(%(chain)s)
"""


@cache
def incremental_postgres_saver() -> type[Any]:
    """LangGraph's `PostgresSaver`, whose `DeltaChannel` loads read what changed since the last.

    Its own load pages through the thread's newest 1,024 checkpoints, probing
    each one's JSON for every channel, on every turn: in a long session that is
    most of a turn's time in the database. Like `IncrementalSqliteSaver`, this
    one walks back only to the thread's last loaded checkpoint. A class made on
    first use: the `postgres` extra is optional.
    """
    from langgraph.checkpoint.postgres import PostgresSaver

    class IncrementalPostgresSaver(_KnownHistories, PostgresSaver):
        def _latest_id(self, config: RunnableConfig, key: tuple[Any, str]) -> str | None:
            saved = self.get_tuple(config)
            return get_checkpoint_id(saved.config) if saved is not None else None

        def _since(self, key: tuple[Any, str], target: str, known: Known) -> History | None:
            channels = list(known[1])
            where = {"thread": str(key[0]), "ns": key[1], "channels": channels}
            with self._cursor() as cur:
                cur.execute(
                    POSTGRES_CHAIN_SQL,
                    {**where, "target": target, "known": known[0], "max_walk": self.max_walk},
                )
                rows = cur.fetchall()[1:]  # the target's own writes are not its history
                if (
                    not rows
                    or rows[-1]["checkpoint_id"] != known[0]
                    or any(r["seeded"] for r in rows)
                ):
                    return None  # too far, a lost chain, or a snapshot on the way
                walked = [r["checkpoint_id"] for r in rows]
                cur.execute(POSTGRES_WRITES_SQL, {**where, "chain": walked})
                stored = cur.fetchall()
            order = {cid: n for n, cid in enumerate(reversed(walked))}
            stored.sort(
                key=lambda w: (
                    order[w["checkpoint_id"]],
                    writes_sort_key(w["task_path"], w["task_id"], w["idx"]),
                )
            )
            return {
                c: {
                    **known[1][c],
                    "writes": [
                        *known[1][c]["writes"],
                        *(
                            (w["task_id"], c, self.serde.loads_typed((w["type"], w["blob"])))
                            for w in stored
                            if w["channel"] == c
                        ),
                    ],
                }
                for c in channels
            }

    return IncrementalPostgresSaver


def inside_parent_run(config: RunnableConfig | None) -> bool:
    """Whether `config` is that of a task of a running graph: a subgraph call, or a node or
    tool passing its own config on (LangGraph then owns `checkpoint_ns`)."""
    return CONFIG_KEY_TASK_ID in ((config or {}).get("configurable") or {})


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
