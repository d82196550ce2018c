"""`ToolCalls`: how a reply's tool calls run, how many rounds a turn may take, and the
caller's hooks around them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from nodes.core.feature import Feature
from nodes.tools.hooks import AuditEvent, ToolHooks


class ToolCalls(Feature):
    """Running the model's tool calls.

    Which tools a session may use is `LoopConfig.tools` / `restricted_tools`;
    this says how their calls run.

    Example:
        >>> LoopConfig(model=model, tools=[get_time], features=[ToolCalls(execution="sequential", max_rounds=4)])
    """

    max_rounds: int = Field(
        default=8,
        gt=0,
        description="model calls per turn; the last round's calls get `round_limit` results",
    )
    execution: Literal["parallel", "sequential"] = Field(
        default="parallel",
        description='`"parallel"` (a batch\'s calls at once, up to `parallelism`) or `"sequential"` (one call at a time, in order)',
    )
    parallelism: int = Field(default=4, gt=0, description="concurrent calls in a batch")
    hooks: ToolHooks = Field(
        default_factory=ToolHooks,
        description="`before_batch`, `after_batch`, `before_call` (may veto), `after_call`",
    )
    on_audit: Callable[[AuditEvent], None] | None = Field(
        default=None,
        description="receives `AuditEvent`s of restricted denials (`graph.sinks.JsonlSink` writes JSON lines)",
    )

    @property
    def sequential(self) -> bool:
        return self.execution == "sequential"
