"""`prune_checkpoints`: keep each session's latest checkpoints, lose nothing of its transcript.

Every superstep adds a checkpoint and nothing removes one, so a long-lived
companion's database only grows. Pruning keeps the newest `keep` checkpoints
of each session and deletes the older ones with their writes (and, on
Postgres, the value blobs only they used).

The transcript is a `DeltaChannel` (Beta): a checkpoint stores only the
messages its step added, and its full value is rebuilt by walking back through
its ancestors' writes to the nearest snapshot. Deleting those ancestors would
silently empty it. So each kept checkpoint whose parent is deleted (in a
session without forks, only the oldest kept one) first gets the full value of
every such channel written into it as a snapshot and becomes a root: every
kept checkpoint's walk now ends there, on rows that stay. Writes stored on
kept checkpoints (the deltas their children are built from, and the latest
checkpoint's pending writes an interrupted turn resumes from) are never
touched, and a checkpoint a running turn saves meanwhile is newer than all
kept ones, so it is never deleted.

    with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        print(prune_checkpoints(saver, keep=20))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph

from graph.storage.retention_tables import CheckpointTables, Deleted, NewRoot, checkpoint_tables
from nodes.core.state import LoopState
from nodes.kernel.compat import DeltaChannel, delta_channels_replayed, delta_snapshots

DEFAULT_KEEP = 20
"""Checkpoints kept per session by default: the last few turns stay open to time travel."""

log = logging.getLogger("cyrene.retention")


@dataclass(frozen=True)
class PruneReport:
    """What a prune did. `skipped` are sessions left whole: they hold a
    `DeltaChannel` this loop does not know, whose value it cannot rebuild."""

    sessions: int = 0
    checkpoints_deleted: int = 0
    writes_deleted: int = 0
    snapshots_written: int = 0
    skipped: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        text = (
            f"pruned {self.sessions} session(s): deleted {self.checkpoints_deleted} checkpoints "
            f"and {self.writes_deleted} writes; {self.snapshots_written} kept checkpoint(s) "
            "now hold the full transcript"
        )
        if self.skipped:
            text += f"; left whole (unknown delta channels): {', '.join(self.skipped)}"
        return text


def prune_checkpoints(
    saver: BaseCheckpointSaver,
    *,
    keep: int = DEFAULT_KEEP,
    thread_ids: Sequence[str] | None = None,
    vacuum: bool = True,
) -> PruneReport:
    """Keep the newest `keep` checkpoints of each session; delete the rest, not the transcript.

    Args:
        saver: a `SqliteSaver` or `PostgresSaver`, e.g. from `open_checkpointer`.
        keep: checkpoints kept per session (and per checkpoint namespace); at least 1.
        thread_ids: the sessions to prune; every session in the database when `None`.
        vacuum: give the freed space back afterwards (SQLite `VACUUM`, which shrinks
            the file; Postgres plain `VACUUM`, which lets the tables reuse it).

    Returns:
        A `PruneReport`; `str()` of it is a one-line summary.

    Raises:
        ValueError: `keep` is below 1.
        TypeError: a saver without tables this knows (an in-memory saver, say).

    Example:
        >>> with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        ...     prune_checkpoints(saver, keep=20).checkpoints_deleted
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: a session needs at least its latest checkpoint")
    tables = checkpoint_tables(saver)
    specs = transcript_channels()
    report = PruneReport()
    pruned: set[str] = set()
    for thread_id, ns in tables.namespaces(thread_ids):
        plan = _plan(saver, tables, specs, thread_id, ns, keep)
        if plan is None:
            report = replace(report, skipped=(*report.skipped, thread_id))
            continue
        if not plan.cutoff:
            continue
        deleted = tables.prune(thread_id, ns, plan.cutoff, plan.roots)
        pruned.add(thread_id)
        report = _add(report, deleted, sum(len(r.snapshots) > 0 for r in plan.roots))
    report = replace(report, sessions=len(pruned))
    if vacuum and report.checkpoints_deleted:
        tables.vacuum()
    return report


def transcript_channels() -> dict[str, DeltaChannel]:
    """The loop's `DeltaChannel`s by name, as the graph builds them (their reducers rebuild values)."""
    channels = StateGraph(LoopState).channels
    return {name: ch for name, ch in channels.items() if isinstance(ch, DeltaChannel)}


@dataclass(frozen=True)
class _Plan:
    cutoff: str | None
    """The oldest kept checkpoint id (every older one goes); `None`: nothing to delete."""
    roots: list[NewRoot]


def _plan(
    saver: BaseCheckpointSaver,
    tables: CheckpointTables,
    specs: dict[str, DeltaChannel],
    thread_id: str,
    ns: str,
    keep: int,
) -> _Plan | None:
    """What one namespace's prune writes and where it cuts; `None` if it can't be done safely."""
    newest = tables.newest(thread_id, ns, keep + 1)
    if len(newest) <= keep:
        return _Plan(None, [])
    kept = newest[:keep]
    kept_ids = {checkpoint_id for checkpoint_id, _ in kept}
    roots = []
    for checkpoint_id, parent in kept:
        if parent is None or parent in kept_ids:
            continue
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }
        saved = saver.get_tuple(config)
        if saved is None:  # pruned meanwhile by another process
            return _Plan(None, [])
        replayed = delta_channels_replayed(saved)
        if unknown := replayed - specs.keys():
            log.warning(
                "not pruning session %r: its delta channel(s) %s are not the loop's",
                thread_id,
                sorted(unknown),
            )
            return None
        wanted = {name: specs[name] for name in replayed}
        versions = saved.checkpoint["channel_versions"]
        roots.append(
            NewRoot(
                checkpoint_id,
                delta_snapshots(saver, saved.config, wanted) if wanted else {},
                {name: str(versions[name]) for name in wanted},
            )
        )
    return _Plan(kept[-1][0], roots)


def _add(report: PruneReport, deleted: Deleted, snapshots: int) -> PruneReport:
    return replace(
        report,
        checkpoints_deleted=report.checkpoints_deleted + deleted.checkpoints,
        writes_deleted=report.writes_deleted + deleted.writes,
        snapshots_written=report.snapshots_written + snapshots,
    )
