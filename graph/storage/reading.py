"""Stored sessions, read without the loop: `cyrene history` and `cyrene sessions`.

Building the graph to read a transcript loads LangGraph's graph machinery and
every node (most of a second) to do what the checkpoint alone can: a
session's state is its latest checkpoint's values, and the two `DeltaChannel`s
(`messages`, `summary`) are rebuilt as LangGraph's loader rebuilds them, from
the nearest stored snapshot and the writes after it, folded by the channels'
own reducers. The reducers are batching-invariant (a `DeltaChannel` requires
it), so one fold over every write gives what a step-by-step replay gives;
tests/test_cli_sessions.py checks the result against `get_state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.storage.archive import whole_transcript
from graph.storage.retention_tables import checkpoint_tables
from nodes.core.protocols import TranscriptArchive
from nodes.core.reducers import latest_summary, merge_transcript
from nodes.kernel.compat import DeltaSnapshot, delta_channels_replayed
from nodes.token_accounting.usage import clean_usage

REDUCERS: Mapping[str, Callable[[Any, Sequence[Any]], Any]] = {
    "messages": merge_transcript,
    "summary": latest_summary,
}
"""The loop's `DeltaChannel`s and their reducers (`nodes.core.state.LoopState`)."""
EMPTY: Mapping[str, Callable[[], Any]] = {"messages": list, "summary": dict}


@dataclass(frozen=True)
class StoredSession:
    """A session as its latest checkpoint left it."""

    thread_id: str
    updated: str
    """When its latest checkpoint was written (ISO 8601, UTC)."""
    values: dict[str, Any]
    """Its state: the live window in `messages`, `archived`, `token_usage`, …"""

    @property
    def message_count(self) -> int:
        """Messages in the whole transcript: the archived ones and the live window."""
        archived = (self.values.get("archived") or {}).get("messages", 0)
        return int(archived) + len(self.values.get("messages", []))

    @property
    def token_usage(self) -> Mapping[str, Any] | None:
        """The session's token totals, when its models reported any."""
        return clean_usage((self.values.get("token_usage") or {}).get("session"))

    @property
    def token_purposes(self) -> dict[str, Mapping[str, Any]]:
        """The session's totals of the loop's other model calls, per purpose (compaction,
        presence, extraction, vision, middleware); its replies' are `token_usage` less these."""
        purposes = (self.values.get("token_usage") or {}).get("purposes") or {}
        return {str(k): u for k, v in purposes.items() if (u := clean_usage(v)) is not None}

    def transcript(
        self, archive: TranscriptArchive | None, last: int | None = None
    ) -> list[BaseMessage]:
        """The whole transcript (what `archive` holds of it, then the live window), or only
        its `last` messages: the archive is read from there on, not from the start."""
        start = 0 if last is None else max(self.message_count - last, 0)
        return whole_transcript(archive, (self.thread_id, ""), self.values, start)


def read_session(saver: BaseCheckpointSaver, thread_id: str) -> StoredSession | None:
    """The session `thread_id` as its latest checkpoint left it; None when it has none."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    saved = saver.get_tuple(config)
    if saved is None:
        return None
    stored = saved.checkpoint["channel_values"]
    values = {k: _unwrapped(v) for k, v in stored.items() if not _internal(k)}
    replayed = sorted(delta_channels_replayed(saved) & REDUCERS.keys())
    if replayed:
        histories = saver.get_delta_channel_history(config=saved.config, channels=replayed)
        for name in replayed:
            seed = histories[name].get("seed")
            start = EMPTY[name]() if seed is None else _unwrapped(seed)
            values[name] = REDUCERS[name](start, [write[2] for write in histories[name]["writes"]])
    return StoredSession(thread_id, saved.checkpoint["ts"], values)


def stored_sessions(saver: BaseCheckpointSaver) -> list[StoredSession]:
    """Every session in the saver's database, the most recently active first."""
    threads = sorted({thread for thread, ns in checkpoint_tables(saver).namespaces(None) if not ns})
    sessions = [s for thread in threads if (s := read_session(saver, thread)) is not None]
    return sorted(sessions, key=lambda s: s.updated, reverse=True)


def _unwrapped(value: Any) -> Any:
    return value.value if isinstance(value, DeltaSnapshot) else value


def _internal(channel: str) -> bool:
    """LangGraph's own channels (`__start__`, `branch:to:…`): routing, not state."""
    return channel.startswith("__") or ":" in channel
