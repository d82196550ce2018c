"""`LoopConfig` and `Persona`: every knob of the loop, validated at the boundary.

Each field maps to a knob of the seed's `loop.Options` (options.go); the README's
configuration table lists them all. Validation happens when the config is built
(so `build_graph(LoopConfig(...))` fails before any graph exists), and every
error names the offending field.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nodes.capacity import CapacityPolicy
from nodes.guards import Guard
from nodes.tool_policy import ToolHooks

ModelLike = BaseChatModel | str
DEFAULT_REFUSAL = "抱歉，这个话题我不能继续。"


class Persona(BaseModel):
    """One voice of the companion: its system prompt, display name and thinking knobs.

    Knobs left at `None` inherit the loop-wide defaults in `LoopConfig`
    (the seed's `PersonaKnobs` falling back to `Options.Thinking` & co.).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    name: str = Field(default="", description="Display name, e.g. 昔涟; empty means 'use the id'.")
    instructions: str = Field(default="", description="System prompt; always the first message.")
    thinking_budget: int | None = Field(
        default=None, ge=0, description="Anthropic-style extended-thinking token budget."
    )
    reasoning_effort: str | None = Field(
        default=None, description="OpenAI-style reasoning effort (minimal/low/medium/high)."
    )
    show_thinking: bool | None = Field(
        default=None, description="Stream thinking to the user; the transcript keeps it anyway."
    )
    model: ModelLike | None = Field(
        default=None, description="Per-persona chat model; defaults to LoopConfig.model."
    )


class LoopConfig(BaseModel):
    """Everything `build_graph` needs. Field order follows DESIGN §7."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    model: ModelLike
    personas: dict[str, Persona] = Field(default_factory=dict)
    default_persona: str | None = None
    tools: Sequence[BaseTool | Callable[..., Any]] = ()
    restricted_tools: frozenset[str] = frozenset()
    capacity: CapacityPolicy | None = None
    memory: Any = None
    extractor: Any = None
    timezone: str | None = None
    max_rounds: int = Field(default=8, gt=0)
    tool_execution: Literal["parallel", "sequential"] = "parallel"
    tool_parallelism: int = Field(default=4, gt=0)
    durability: Literal["sync", "async", "exit"] = "sync"
    """When each step's checkpoint is saved. `sync` (our default) saves it before
    the next step starts, so after a crash no finished tool call runs again;
    LangGraph's own default, `async`, saves it while the next step runs and a
    crash can lose finished steps. Per run, `invoke(..., durability=...)` wins."""
    max_context_tokens: int = Field(default=0, ge=0)
    compactor: Any = None
    vision: Any = None
    model_accepts_images: bool | None = None
    max_image_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    transform_context: Callable[[list[Any], int], list[Any]] | None = None
    guards: Sequence[Guard] = ()
    hooks: ToolHooks = Field(default_factory=ToolHooks)
    on_audit: Callable[[Any], None] | None = None
    on_capacity: Callable[[Any], None] | None = None
    on_turn_end: Callable[[str, str, str | None], Any] | None = None
    # Loop-wide thinking defaults for personas that leave theirs unset.
    thinking_budget: int | None = Field(default=None, ge=0)
    reasoning_effort: str | None = None
    show_thinking: bool = True
    refusal_text: str = DEFAULT_REFUSAL
    attribution_encoding: Literal["auto", "inline", "leading"] = "auto"
    extraction_timeout: float = Field(default=60.0, gt=0)
    memory_k: int = Field(default=8, gt=0)
    clock: Callable[[], datetime] = Field(default=lambda: datetime.now(UTC))

    @field_validator("tools", mode="before")
    @classmethod
    def _coerce_tools(cls, value: Any) -> tuple[BaseTool, ...]:
        tools = tuple(t if isinstance(t, BaseTool) else as_tool(t) for t in value or ())
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tools: duplicate tool names {dupes}")
        return tools

    @field_validator("restricted_tools", mode="before")
    @classmethod
    def _coerce_restricted(cls, value: Any) -> frozenset[str]:
        if isinstance(value, str):
            raise ValueError("restricted_tools: expected a collection of tool names, not a string")
        return frozenset(value or ())

    @model_validator(mode="after")
    def _check_references(self) -> LoopConfig:
        if self.default_persona is not None and self.default_persona not in self.personas:
            raise ValueError(
                f"default_persona: {self.default_persona!r} is not one of the personas "
                f"{sorted(self.personas)}"
            )
        if self.default_persona is None and self.personas:
            raise ValueError("default_persona: required when personas are configured")
        unknown = sorted(self.restricted_tools - set(self.tool_names))
        if unknown:
            raise ValueError(f"restricted_tools: {unknown} are not among the configured tools")
        if self.capacity is not None:
            self.capacity.check_tools(self.tool_names)
        return self

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]  # type: ignore[union-attr]

    def zone(self) -> ZoneInfo | None:
        """The IANA zone for the time block; an invalid name warns and turns it off (seed)."""
        if not self.timezone:
            return None
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            warnings.warn(
                f"timezone: {self.timezone!r} is not a valid IANA zone; the time block is off",
                UserWarning,
                stacklevel=3,
            )
            return None
