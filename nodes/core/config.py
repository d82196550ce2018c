"""`LoopConfig` and `Persona`: what every turn needs, validated at the boundary.

`LoopConfig` holds what every turn needs (the model, personas, tools, memory,
durability) and the list of features and middleware; each feature's own
settings live in its folder (`nodes.core.feature.Feature`). docs/configuration.md
lists every field of each. Validation happens when the config is built (so
`build_graph(LoopConfig(...))` fails before any graph exists), and every error
names the offending field.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from langgraph.types import RetryPolicy
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from memory.protocols import Extractor, MemoryBackend
from nodes.core.feature import MOVED_TO_FEATURES, Feature, refuse_unknown_fields
from nodes.core.policy import RoundPolicy
from nodes.kernel.provider_errors import retry_policy

ModelLike = BaseChatModel | str
FeatureT = TypeVar("FeatureT", bound=Feature)


MOVED_FIELDS = {
    **dict.fromkeys(
        (
            "model_retries",
            "retry_initial_interval",
            "retry_backoff",
            "retry_max_interval",
            "retry_jitter",
            "max_attempts",
        ),
        "part of 'retry' (retry={'max_attempts': 3, 'initial_interval': 0.5, ...})",
    ),
    **{
        old: f"{kind}({field}=...) in features=[...] (from graph import {kind})"
        for old, (kind, field) in MOVED_TO_FEATURES.items()
    },
}
"""What an old field's error says: where it went."""


def repeated(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted (for "must be unique" errors)."""
    return sorted(name for name, count in Counter(names).items() if count > 1)


class Persona(BaseModel):
    """One voice of the companion: its system prompt, display name and thinking knobs.

    Knobs left at `None` inherit the loop-wide defaults (`Thinking` in `LoopConfig.features`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data)

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
    model_accepts_thinking: bool | None = Field(
        default=None,
        description="Whether the persona's model takes its thinking knobs; None reads its LangChain profile.",
    )
    model: ModelLike | None = Field(
        default=None, description="Per-persona chat model; defaults to LoopConfig.model."
    )
    nicknames: tuple[str, ...] = Field(
        default=(),
        description="Other names group members call the persona by; any of them in a message's text mentions it.",
    )

    @field_validator("nicknames", mode="before")
    @classmethod
    def _check_nicknames(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            raise ValueError("nicknames: expected a list of names, not a string")
        names = tuple(value or ())
        for index, name in enumerate(names):
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"nicknames[{index}]: expected a non-blank name, got {name!r}")
        return tuple(name.strip() for name in names)


class LoopConfig(BaseModel):
    """Everything `build_graph` needs: what every turn uses, then the features and
    middleware. Field order follows the table in docs/configuration.md.

    A feature's own settings are one entry of `features` (`GroupPresence`,
    `Compaction`, `CapacityPolicy`, `ToolCalls`, `ModelView`, …); a feature not
    listed runs with its defaults. Unknown fields are refused, naming the closest
    real one, or the feature a moved one went to.

    Example:
        >>> LoopConfig(model="openai:gpt-4o-mini", tools=[get_time],
        ...            features=[GroupPresence(reply="mentioned"), Compaction(max_context_tokens=8000)])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    model: ModelLike = Field(
        description='a `BaseChatModel` or a `"provider:model"` string (via `init_chat_model`)'
    )
    personas: dict[str, Persona] = Field(
        default_factory=dict,
        description="id → `Persona(name, instructions, thinking_budget, reasoning_effort, show_thinking, model_accepts_thinking, model, nicknames)`",
    )
    default_persona: str | None = Field(
        default=None,
        description="the persona for unknown ids and for every restricted session (required with personas)",
    )
    tools: tuple[BaseTool, ...] = Field(
        default=(),
        description="LangChain tools (plain functions are wrapped); names must be unique",
    )
    restricted_tools: frozenset[str] = Field(
        default=frozenset(),
        description="the only tools group/stranger sessions see or may run; others get `not_allowed` + an audit event",
    )
    memory: MemoryBackend | None = Field(
        default=None,
        description="a `MemoryStore` (or anything with `search` / `add_many`)",
    )
    extractor: Extractor | None = Field(
        default=None,
        description="`.extract(messages) -> list[MemoryItem]`, `.background`; optionally "
        "`.extract_operations(messages, memories)` (supersede, forget)",
    )
    timezone: str | None = Field(
        default=None,
        description="IANA zone for the per-round time block; an invalid one warns and turns it off",
    )
    clock: Callable[[], datetime] = Field(
        default=lambda: datetime.now(UTC), description="the time source (tests pass a fixed one)"
    )
    durability: Literal["sync", "async", "exit"] = Field(
        default="sync",
        description='when a step\'s checkpoint is saved: `"sync"` before the next step starts (no finished tool call re-runs after a crash), `"async"` (LangGraph\'s default) or `"exit"`; a run\'s `durability=` wins',
    )
    retry: RetryPolicy | None = Field(
        default_factory=lambda: retry_policy({}),
        description="LangGraph's `RetryPolicy` for a model call (or a mapping of its arguments): by default 3 attempts, 0.5 s then 1 s apart plus jitter, on transient errors only (429, 5xx, timeouts, dropped connections: `is_transient`); `None` = off",
    )
    model_timeout: float | None = Field(
        default=120.0,
        gt=0,
        description="seconds a model call may take, the whole streamed reply included; a slower one is abandoned and counts as a transient error (`None` = no limit, as the provider SDKs under LangChain have none)",
    )
    features: Sequence[SerializeAsAny[Feature]] = Field(
        default=(),
        description="each feature's settings, one entry per feature (`GroupPresence`, `Compaction`, `CapacityPolicy`, `ToolCalls`, `ModelView`, `ConversationRecall`, `Guards`, `Vision`, `Thinking`, `Fallbacks`, `Extraction`, `TurnEnd`, `Sessions`); one not listed runs with its defaults (the tables below)",
    )
    middleware: Sequence[Any] = Field(
        default=(),
        description=(
            "LangChain `AgentMiddleware`s, run inside the loop's nodes after the built-in guards (`before_model`, `wrap_model_call`, `after_model`, `wrap_tool_call`, their async forms, `state_schema`, `tools`; "
            'docs/configuration.md "LangChain middleware")'
        ),
    )
    policies: Sequence[RoundPolicy] = Field(
        default=(),
        description="your own `RoundPolicy`s, run after the built-in ones in this order (`before_model`, `wrap_model_call`, `after_model`; see `nodes.core.policy`)",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data, MOVED_FIELDS)

    @field_validator("retry", mode="before")
    @classmethod
    def _as_retry_policy(cls, value: Any) -> RetryPolicy | None:
        return retry_policy(value)

    @field_validator("features", mode="before")
    @classmethod
    def _check_features(cls, value: Any) -> tuple[Feature, ...]:
        if isinstance(value, Feature):
            raise ValueError(
                f"features: expected a list of feature settings, e.g. features=[{type(value).__name__}(...)]"
            )
        features = tuple(value or ())
        for index, feature in enumerate(features):
            if not isinstance(feature, Feature):
                raise ValueError(
                    f"features[{index}]: expected a feature's settings (GroupPresence, "
                    f"Compaction, …), got {type(feature).__name__}"
                )
        if dupes := repeated(f.kind().__name__ for f in features):
            raise ValueError(f"features: each feature once, repeated: {dupes}")
        return features

    @field_validator("policies", mode="before")
    @classmethod
    def _check_policies(cls, value: Any) -> tuple[RoundPolicy, ...]:
        policies = tuple(value or ())
        for index, policy in enumerate(policies):
            if not isinstance(policy, RoundPolicy):
                raise ValueError(
                    f"policies[{index}]: expected a RoundPolicy, got {type(policy).__name__}"
                )
        return policies

    @field_validator("middleware", mode="before")
    @classmethod
    def _check_middleware(cls, value: Any) -> tuple[Any, ...]:
        middleware = tuple(value or ())
        if middleware:
            from langchain.agents.middleware import AgentMiddleware

            for index, each in enumerate(middleware):
                if not isinstance(each, AgentMiddleware):
                    raise ValueError(
                        f"middleware[{index}]: expected a langchain AgentMiddleware, "
                        f"got {type(each).__name__}"
                    )
        return middleware

    @field_validator("tools", mode="before")
    @classmethod
    def _coerce_tools(cls, value: Any) -> tuple[BaseTool, ...]:
        tools = tuple(t if isinstance(t, BaseTool) else as_tool(t) for t in value or ())
        if dupes := repeated(t.name for t in tools):
            raise ValueError(f"tools: duplicate tool names {dupes}")
        return tools

    @field_validator("restricted_tools", mode="before")
    @classmethod
    def _coerce_restricted(cls, value: Any) -> frozenset[str]:
        if isinstance(value, str):
            raise ValueError("restricted_tools: expected a collection of tool names, not a string")
        return frozenset(value or ())

    @model_validator(mode="after")
    def _check_middleware_tools(self) -> LoopConfig:
        own = {t.name for t in self.tools}
        for index, each in enumerate(self.middleware):
            if clash := sorted(own & {t.name for t in getattr(each, "tools", ())}):
                raise ValueError(
                    f"middleware[{index}] brings tools named {clash}, as tools has: "
                    "tool names must be unique"
                )
        return self

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
        for feature in self.features:
            feature.check_tools(self.tool_names)
        return self

    def feature(self, kind: type[FeatureT]) -> FeatureT:
        """The settings of the feature `kind`: the entry in `features`, else its defaults.

        Example:
            >>> config.feature(Compaction).max_context_tokens
            'auto'
        """
        for feature in self.features:
            if isinstance(feature, kind):
                return feature
        return kind.defaults()

    def with_features(self, *features: Feature) -> LoopConfig:
        """A copy whose `features` hold these, each in place of the entry of its kind.

        Example:
            >>> quiet = config.with_features(GroupPresence(reply="mentioned"))
        """
        given = {feature.kind(): feature for feature in self._check_features(features)}
        if len(given) < len(features):
            raise ValueError("with_features: each feature once")
        kept = [given.pop(f.kind(), f) for f in self.features]  # in its place
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, "features": (*kept, *given.values())})

    @property
    def tool_names(self) -> list[str]:
        """Every tool the loop runs: its own, then those its middleware brings."""
        return [t.name for t in self.all_tools]

    @property
    def all_tools(self) -> list[BaseTool]:
        return [*self.tools, *(t for m in self.middleware for t in getattr(m, "tools", ()))]

    def zone(self) -> ZoneInfo | None:
        """The IANA zone for the time block; an invalid name warns and turns it off."""
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
