"""`resume_extractions`: run again the background extractions a stopped process left pending.

Every turn records its background extraction in the session's checkpoint
before it returns (`nodes.extraction.node`), and the memory store's ledger records
each one that finished (`nodes.extraction.ledger`). A session's next turn re-submits
what its checkpoint still lists; this call does the same for every session at
once, so a fact said just before a crash is stored even if that session never
speaks again. A session whose run died after its reply and before
`extract_memory` lists nothing yet; its checkpoint waits at that node, and this
call submits what the node would have (`nodes.extraction.node.extract_waiting`).
Call it when a process starts, before serving turns.

Cost: one pass over `checkpointer.list(None)` (LangGraph has no "latest
checkpoint of each thread" query; the newest comes first per thread, and only
that one is used; 2,656 checkpoints of Postgres took 0.2 s here), or with
`threads` one `list(..., limit=1)` per named session; then one ledger read
for every listed key, and a state read only for the sessions that still have
unfinished work or wait at `extract_memory`. Checkpoint retention keeps the pass short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from graph.builder import build_graph
from nodes.core.config import LoopConfig
from nodes.core.loop import Loop
from nodes.core.stages import EXTRACT
from nodes.extraction.background import unfinished
from nodes.extraction.node import background_jobs, extract_waiting, resubmit
from nodes.extraction.settings import PENDING, PendingExtraction
from nodes.kernel.compat import waits_at
from nodes.kernel.run_config import configurable, thread_id


class LatestPending:
    """Fed checkpoints newest first per thread: thread id → the extractions its latest root
    checkpoint lists as pending."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.pending: dict[str, list[PendingExtraction]] = {}
        self.waiting: set[str] = set()
        """Threads whose latest run died just before `extract_memory`."""

    def add(self, saved: CheckpointTuple) -> None:
        thread = thread_id(saved.config)
        if thread is None or configurable(saved.config).get("checkpoint_ns") or thread in self.seen:
            return
        self.seen.add(thread)
        if entries := saved.checkpoint["channel_values"].get(PENDING):
            self.pending[thread] = list(entries)
        if waits_at(saved, EXTRACT):
            self.waiting.add(thread)


def _open_work(
    loop: Loop, listed: dict[str, list[PendingExtraction]]
) -> dict[str, list[PendingExtraction]]:
    """The listed extractions this process does not have in hand and the ledger does not
    call finished."""
    keys = [e["key"] for entries in listed.values() for e in entries]
    jobs = background_jobs(loop)
    store = loop.config.memory
    still = unfinished(store, [k for k in keys if not jobs.known(store, k)])
    open_work = {t: [e for e in entries if e["key"] in still] for t, entries in listed.items()}
    return {t: entries for t, entries in open_work.items() if entries}


def _to_read(work: dict[str, list[PendingExtraction]], waiting: set[str]) -> list[str]:
    """The sessions whose state recovery reads, each once."""
    return list(dict.fromkeys([*work, *waiting]))


def _recover(
    loop: Loop,
    thread: str,
    values: dict[str, Any],
    work: dict[str, list[PendingExtraction]],
    waiting: set[str],
) -> int:
    """Hand one session's unfinished extractions to the background; how many."""
    entries = work.get(thread, [])
    resubmit(loop, entries, values.get("messages", []), backlog=True)
    late = extract_waiting(loop, _thread(thread), values) if thread in waiting else 0
    return len(entries) + late


def _thread(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _scans(threads: Collection[str] | None) -> list[tuple[RunnableConfig | None, int | None]]:
    """`list` arguments: every checkpoint, or the latest of each named thread."""
    if threads is None:
        return [(None, None)]
    return [(_thread(t), 1) for t in threads]


def _loop_and_graph(config: LoopConfig, checkpointer: BaseCheckpointSaver) -> tuple[Loop, Any]:
    return Loop.from_config(config), build_graph(config, checkpointer)


def resume_extractions(
    config: LoopConfig,
    checkpointer: BaseCheckpointSaver,
    threads: Collection[str] | None = None,
) -> int:
    """Re-submit every session's unfinished background extraction.

    The work runs in this process's background pipeline; a key the ledger
    calls done (or lost) is never run again, and a key another live process
    is running is left to it. Several processes may call it at once: each
    extraction is claimed by one of them (a compare-and-swap in the ledger).
    Call it once at start, e.g. right after `open_checkpointer`;
    `wait_for_extractions(timeout)` drains the work.

    Args:
        config: the loop's configuration (its `memory` and `extractor` do the work).
        checkpointer: the sessions' saver (a sync one; see `aresume_extractions`).
        threads: only these sessions (default: every session the saver holds).

    Returns:
        How many extractions were handed to the background pipeline.

    Example:
        >>> with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        ...     resume_extractions(config, saver)
        ...     graph = build_graph(config, saver)
    """
    if config.extractor is None or config.memory is None:
        return 0
    loop, graph, latest = *_loop_and_graph(config, checkpointer), LatestPending()
    for where, limit in _scans(threads):
        for saved in checkpointer.list(where, limit=limit):
            latest.add(saved)
    work = _open_work(loop, latest.pending)
    return sum(
        _recover(loop, thread, graph.get_state(_thread(thread)).values, work, latest.waiting)
        for thread in _to_read(work, latest.waiting)
    )


async def aresume_extractions(
    config: LoopConfig,
    checkpointer: BaseCheckpointSaver,
    threads: Collection[str] | None = None,
) -> int:
    """`resume_extractions` for an async saver (`async with open_checkpointer(...)`)."""
    if config.extractor is None or config.memory is None:
        return 0
    loop, graph, latest = *_loop_and_graph(config, checkpointer), LatestPending()
    for where, limit in _scans(threads):
        async for saved in checkpointer.alist(where, limit=limit):
            latest.add(saved)
    work = await asyncio.to_thread(_open_work, loop, latest.pending)  # the ledger read blocks
    handed = 0
    for thread in _to_read(work, latest.waiting):
        state = await graph.aget_state(_thread(thread))
        handed += _recover(loop, thread, state.values, work, latest.waiting)
    return handed
