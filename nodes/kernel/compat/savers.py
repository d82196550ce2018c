"""Checkpoint savers whose `DeltaChannel` loads cost what changed since the thread's last load.

LangGraph rebuilds a `DeltaChannel` (the transcript) on every load by walking back
to the channel's last snapshot, up to 100 updates, and deserialising every write
since: in a long session that walk is most of a turn. Each saver here keeps the
thread's last loaded history and walks back only to it; anything it cannot
shortcut cleanly (an older checkpoint, a fork, a snapshot on the way, a lost
chain) is LangGraph's own walk, so the histories are LangGraph's exactly
(`tests/test_compat.py` compares them at every checkpoint).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, get_checkpoint_id, writes_sort_key
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite._delta import (
    DELTA_STAGE1_SQL,
    build_delta_channels_writes_history,
    build_delta_stage2_sql,
)

__all__ = [
    "IncrementalMemorySaver",
    "IncrementalSqliteSaver",
    "incremental_postgres_saver",
    "keyed_async_postgres_saver",
]

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
SELECT checkpoint_id, parent_checkpoint_id, checkpoint -> 'channel_values' ?| %(channels)s AS seeded
FROM checkpoints
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
    AND checkpoint_id BETWEEN %(known)s AND %(target)s
ORDER BY checkpoint_id DESC LIMIT %(limit)s
"""
"""The checkpoints from the known one up to the target, newest first, and whether each stores
a value (a snapshot) of one of the channels. A range of the primary key, so the plan is an
index scan whatever the table's statistics say (a new database has none until it is
analysed)."""
POSTGRES_WRITES_SQL = """
SELECT checkpoint_id, channel, task_id, idx, type, blob, task_path FROM checkpoint_writes
WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s
    AND checkpoint_id BETWEEN %(known)s AND %(target)s AND checkpoint_id = ANY(%(chain)s)
    AND channel = ANY(%(channels)s)
"""
POSTGRES_SELECT_SQL = """
select thread_id, checkpoint, checkpoint_ns, checkpoint_id, parent_checkpoint_id, metadata,
    (
        select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        from jsonb_each_text(checkpoint -> 'channel_versions') as version
        cross join lateral (
            select b.channel, b.type, b.blob from checkpoint_blobs b
            where b.thread_id = checkpoints.thread_id and b.checkpoint_ns = checkpoints.checkpoint_ns
                and b.channel = version.key and b.version = version.value
            limit 1
        ) as bl
    ) as channel_values,
    (
        select array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea,
            cw.blob, convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = checkpoints.checkpoint_id
    ) as pending_writes
from checkpoints """
"""`PostgresSaver.SELECT_SQL` with each channel's blob fetched by its primary key. LangGraph's
joins the channel versions to the thread's blobs, which the planner runs as a hash join over
every blob the thread has (one per turn, for the input), so reading the newest checkpoint
grows with the session: 5.4 ms at 4,000 turns, 0.4 ms this way (`LIMIT 1` keeps the lookup
a nested loop; the key is unique, so it drops nothing)."""


CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
"""LangGraph's savers prepare every statement, and Postgres soon caches a generic plan for
each, made from the table sizes of that moment: planned while a session is young, reading
the newest checkpoint becomes a scan that grows with the session (3 ms a turn by turn 5,000
in one process, 0.3 ms in a new one) until an ANALYZE replans it, and with autovacuum off
none does. Planning each query for its values keeps a turn's reads flat for the price of
the planning (measured as no slower at turn 1,000)."""


@cache
def incremental_postgres_saver() -> type[Any]:
    """LangGraph's `PostgresSaver`, whose `DeltaChannel` loads read what changed since the last.

    Its own load pages through the thread's newest 1,024 checkpoints, probing
    each one's JSON for every channel, on every turn: in a long session that is
    most of a turn's time in the database. Like `IncrementalSqliteSaver`, this
    one walks back only to the thread's last loaded checkpoint; it reads a
    checkpoint's blobs by key (`POSTGRES_SELECT_SQL`), and `setup()` asks for
    plans made per query (`CUSTOM_PLANS`; a pool's connections take it from
    the pool's `configure`). A class made on first use: the `postgres` extra
    is optional.
    """
    from langgraph.checkpoint.postgres import PostgresSaver

    class IncrementalPostgresSaver(_KnownHistories, PostgresSaver):
        SELECT_SQL = POSTGRES_SELECT_SQL

        def setup(self) -> None:
            super().setup()
            with self._cursor() as cur:
                cur.execute(CUSTOM_PLANS)

        def _latest_id(self, config: RunnableConfig, key: tuple[Any, str]) -> str | None:
            saved = self.get_tuple(config)
            return get_checkpoint_id(saved.config) if saved is not None else None

        def _since(self, key: tuple[Any, str], target: str, known: Known) -> History | None:
            channels = list(known[1])
            where = {
                "thread": str(key[0]),
                "ns": key[1],
                "channels": channels,
                "known": known[0],
                "target": target,
            }
            with self._cursor() as cur:
                cur.execute(POSTGRES_CHAIN_SQL, {**where, "limit": self.max_walk + 2})
                walked = _chain_back(cur.fetchall(), target, known[0])
                if walked is None:
                    return None
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


@cache
def keyed_async_postgres_saver() -> type[Any]:
    """LangGraph's `AsyncPostgresSaver`, reading a checkpoint's blobs by key and asking for
    plans made per query, as `incremental_postgres_saver()`'s class does. Its loads are
    LangGraph's own walk (the incremental shortcut is sync only)."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    class KeyedAsyncPostgresSaver(AsyncPostgresSaver):
        SELECT_SQL = POSTGRES_SELECT_SQL

        async def setup(self) -> None:
            await super().setup()
            async with self._cursor() as cur:
                await cur.execute(CUSTOM_PLANS)

    return KeyedAsyncPostgresSaver


def _chain_back(rows: Sequence[Mapping[str, Any]], target: str, known: str) -> list[str] | None:
    """The target's ancestors down to `known`, nearest first, following parent ids through
    `rows` (a range of checkpoints that may hold other branches); None when the chain leaves
    `rows` or passes a snapshot (`seeded`), where LangGraph's own walk is the right one."""
    by_id = {row["checkpoint_id"]: row for row in rows}
    if target not in by_id:
        return None
    walked: list[str] = []
    current = by_id[target]
    while current["checkpoint_id"] != known:
        parent = by_id.get(current["parent_checkpoint_id"])
        if parent is None or parent["seeded"]:
            return None
        walked.append(parent["checkpoint_id"])
        current = parent
    return walked or None
