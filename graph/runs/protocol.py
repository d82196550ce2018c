"""What a run's opening and claim steps ask of the graph that runs them.

`CyreneGraph` (`graph.runs.compiled`) provides every member; `graph.runs.opening` and
`graph.runs.claims` name this protocol rather than the class, so they import nothing
that imports them (the class orders their steps).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.runs.traces import TraceFacts
from nodes.core.env import PersonaOf
from nodes.kernel.steps import Either, Steps


class RunningGraph(Protocol):
    clock: Callable[[], datetime] | None
    max_image_bytes: int
    persona_of: PersonaOf
    records_turns: bool
    trace_facts: TraceFacts | None
    stream_mode: Any

    @property
    def _saves_itself(self) -> bool: ...

    @property
    def _saver(self) -> BaseCheckpointSaver: ...

    def _at(self, config: RunnableConfig | None, checkpoint_id: str | None) -> RunnableConfig: ...

    def _state(self, config: RunnableConfig | None) -> Steps: ...

    def _saved(self, config: RunnableConfig) -> Either: ...

    def _run_kwargs(
        self, config: RunnableConfig | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]: ...

    def _drain(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> None: ...

    async def _adrain(self, input: Any, config: RunnableConfig | None, kwargs: dict) -> None: ...
