"""`CyreneGraph`: the compiled loop, with the checks and defaults every run gets.

A run is admitted at the boundary before any node runs (an empty turn, or a
resume with nothing to resume, is a plain `ValueError`), runs with
`LoopConfig.durability` unless told otherwise, and tells background work
while a turn is in flight. Everything else is LangGraph's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability

from memory.background import TURNS
from nodes.boundary import admit
from nodes.compat import CONFIG_KEY_DURABILITY


class NothingToResumeError(ValueError):
    """`invoke(None, thread)` on a thread with no interrupted turn."""


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
        input, kwargs["context"] = admit(input, config, kwargs.get("context"))
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
        input, kwargs["context"] = admit(input, config, kwargs.get("context"))
        if input is None and self._saves_itself and not await self._aresumable(config or {}):
            raise _nothing_to_resume(config)
        with TURNS.turn():
            async for chunk in super().astream(input, config, **self._run_kwargs(config, kwargs)):
                yield chunk
