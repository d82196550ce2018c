"""`LoopConfig` and `Persona`: every knob of the loop, validated at the boundary.

The table in docs/configuration.md lists every field. Validation happens when the config is built
(so `build_graph(LoopConfig(...))` fails before any graph exists), and every
error names the offending field.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from langgraph.types import RetryPolicy
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memory.protocols import Extractor, MemoryBackend
from nodes.capacity.policy import CapacityEvent, CapacityPolicy, repeated
from nodes.core.policy import RoundPolicy
from nodes.core.protocols import Compactor, ImageDescriber, ReplyJudge
from nodes.guards.policy import Guard
from nodes.kernel.choices import GroupReply, Layout
from nodes.kernel.provider_errors import retry_policy
from nodes.tools.hooks import AuditEvent, ToolHooks

ModelLike = BaseChatModel | str
DEFAULT_REFUSAL = "抱歉，这个话题我不能继续。"
BusyPolicy = Literal["merge", "enqueue", "reject"]


RENAMED_FIELDS = {
    "model_retries": "retry",
    "retry_initial_interval": "retry",
    "retry_backoff": "retry",
    "retry_max_interval": "retry",
    "retry_jitter": "retry",
}
"""Fields that became part of another (the old name's error says where it went)."""


def refuse_unknown_fields(cls: type[BaseModel], data: Any) -> Any:
    """Refuse a field the model does not have, naming the closest real one: a typo such
    as `max_context_tokenz=5` must fail, not leave the real knob at its default."""
    if isinstance(data, dict):
        fields = list(cls.model_fields)
        for name in data:
            if name in cls.model_fields:
                continue
            if (renamed := RENAMED_FIELDS.get(str(name))) in cls.model_fields:
                hint = f"; it is now part of {renamed!r}"
            else:
                close = difflib.get_close_matches(str(name), fields, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{cls.__name__}: unknown field {name!r}{hint}")
    return data


class Persona(BaseModel):
    """One voice of the companion: its system prompt, display name and thinking knobs.

    Knobs left at `None` inherit the loop-wide defaults in `LoopConfig`.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    _refuse_unknown = model_validator(mode="before")(refuse_unknown_fields)

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
    """Everything `build_graph` needs. Field order follows the table in docs/configuration.md.

    Unknown fields are refused, naming the closest real one.
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
    capacity: CapacityPolicy | None = Field(
        default=None,
        description="`CapacityPolicy(tiers=[Tier(name, tools, triggers, decay_turns)])`: wake-style tool tiers",
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
    max_rounds: int = Field(
        default=8,
        gt=0,
        description="model calls per turn; the last round's calls get `round_limit` results",
    )
    tool_execution: Literal["parallel", "sequential"] = Field(
        default="parallel",
        description='or `"sequential"` (one call at a time, in order)',
    )
    tool_parallelism: int = Field(default=4, gt=0, description="concurrent calls in a batch")
    durability: Literal["sync", "async", "exit"] = Field(
        default="sync",
        description='when a step\'s checkpoint is saved: `"sync"` before the next step starts (no finished tool call re-runs after a crash), `"async"` (LangGraph\'s default) or `"exit"`; a run\'s `durability=` wins',
    )
    model_view_step: bool = Field(
        default=False,
        description="run `compact` and `assemble_context` as steps of their own, so each compaction and each round's model view is a node's update in Studio and `stream_mode=\"updates\"` (more checkpoints per round); off, `call_model` compacts and assembles the view itself",
    )
    max_context_tokens: int | Literal["auto"] = Field(
        default="auto",
        description='compaction budget in tokens: `"auto"` takes half the answering model\'s input window from its LangChain profile (`max_input_tokens`), or 16,000 when the profile has none; `0` = off. Older messages the summary covers move to the transcript archive, so a long session costs the same per turn',
    )
    compactor: Compactor | None = Field(
        default=None,
        description="structural (no model call) when unset; `LLMCompactor(model)` writes incremental summaries",
    )
    vision: BaseChatModel | ImageDescriber | None = Field(
        default=None,
        description="a vision chat model or `describe(block) -> str`; `None` passes images through",
    )
    model_accepts_images: bool | None = Field(
        default=None,
        description="keep images for the main model; `None` reads the model's LangChain profile",
    )
    max_image_bytes: int = Field(
        default=10 * 1024 * 1024,
        gt=0,
        description="larger images become a placeholder, never an exception",
    )
    transform_context: Callable[[list[Any], int], list[Any]] | None = Field(
        default=None,
        description="`(messages, round) -> messages`, last step of every view",
    )
    guards: Sequence[Guard] = Field(
        default=(),
        description="`Guard`s (`check_request` / `check_response`); a block ends the turn with `refusal_text`",
    )
    hooks: ToolHooks = Field(
        default_factory=ToolHooks,
        description="`before_batch`, `after_batch`, `before_call` (may veto), `after_call`",
    )
    policies: Sequence[RoundPolicy] = Field(
        default=(),
        description="your own `RoundPolicy`s, run after the built-in ones in this order (`before_model`, `wrap_model_call`, `after_model`; see `nodes.core.policy`)",
    )
    middleware: Sequence[Any] = Field(
        default=(),
        description=(
            "LangChain `AgentMiddleware`s, run inside the loop's nodes after the built-in guards (`before_model`, `wrap_model_call`, `after_model`, `wrap_tool_call`, their async forms, `state_schema`, `tools`; "
            'docs/configuration.md "LangChain middleware")'
        ),
    )
    on_audit: Callable[[AuditEvent], None] | None = Field(
        default=None,
        description="receives `AuditEvent`s of restricted denials (`graph.sinks.JsonlSink` writes JSON lines)",
    )
    on_capacity: Callable[[CapacityEvent], None] | None = Field(
        default=None,
        description="receives `capacity_awaken` / `capacity_sleep` events",
    )
    on_turn_end: Callable[[str, str, str | None], Any] | None = Field(
        default=None,
        description="`(user_text, assistant_text, persona_id) -> mood`",
    )
    thinking_budget: int | None = Field(
        default=None,
        ge=0,
        description="thinking tokens a reply may spend (Anthropic `budget_tokens`, Gemini `thinking_budget`), for personas that set none",
    )
    reasoning_effort: str | None = Field(
        default=None,
        description="how hard a reasoning model thinks (OpenAI `reasoning_effort`, Ollama `reasoning`), for personas that set none",
    )
    show_thinking: bool = Field(
        default=True,
        description="stream a reply's thinking to the caller, for personas that set nothing; `False` keeps it out of the stream, not the transcript",
    )
    model_accepts_thinking: bool | None = Field(
        default=None,
        description="whether the model takes the thinking knobs, for personas that set nothing; `None` reads its LangChain profile (`reasoning_output`: a model that does not reason is sent none, logged once; one without a profile is sent them), `True`/`False` decide for the persona's own model (fallbacks go by their profile)",
    )
    refusal_text: str = Field(default=DEFAULT_REFUSAL, description="what a blocked turn answers")
    attribution_encoding: Literal["auto", "inline", "leading"] = Field(
        default="auto",
        description='`"inline"` (each attribution note a system message in place: OpenAI-style providers) or `"leading"` (one leading system message with a note index: single-system-message providers); `"auto"` picks per provider',
    )
    context_layout: Layout = Field(
        default="round_first",
        description='`"round_first"`: the blocks of the round first (instructions, time, working memory, memories, summary, role declaration, conversation); `"cache"`: what stays the same between rounds first (instructions, role declaration, summary, conversation), time, working memory and memories at the end, with Anthropic `cache_control` breakpoints, so providers can reuse the cached prefix (docs/providers.md "What the model sees")',
    )
    extraction_timeout: float = Field(
        default=60.0,
        gt=0,
        description="seconds a background extraction may take; late results are discarded",
    )
    memory_k: int = Field(default=8, gt=0, description="memories per block")
    clock: Callable[[], datetime] = Field(
        default=lambda: datetime.now(UTC), description="the time source (tests pass a fixed one)"
    )
    retry: RetryPolicy | None = Field(
        default_factory=lambda: retry_policy({}),
        description="LangGraph's `RetryPolicy` for a model call (or a mapping of its arguments): by default 3 attempts, 0.5 s then 1 s apart plus jitter, on transient errors only (429, 5xx, timeouts, dropped connections: `is_transient`); `None` = off",
    )
    fallback_models: Sequence[ModelLike] = Field(
        default=(),
        description='chat models or `"provider:model"` strings tried in order, once each, after the persona\'s model failed and its retries are spent',
    )
    model_timeout: float | None = Field(
        default=120.0,
        gt=0,
        description="seconds a model call may take, the whole streamed reply included; a slower one is abandoned and counts as a transient error (`None` = no limit, as the provider SDKs under LangChain have none)",
    )
    busy_policy: BusyPolicy = Field(
        default="merge",
        description='a message sent while its session runs a turn: `"merge"` waits, and one next turn answers every waiting message (each keeps its speaker); `"enqueue"` waits for a turn of its own, in arrival order; `"reject"` raises `SessionBusyError` at once',
    )
    busy_timeout: float = Field(
        default=300.0,
        gt=0,
        description="seconds a message may wait for its session; then `SessionWaitTimeout` (a `TimeoutError`) and the message is not stored",
    )
    group_reply: GroupReply = Field(
        default="always",
        description='which group-chat turns the companion answers: `"always"` (every turn); `"mentioned"`: a message names the persona or a nickname, or the platform says so (`SessionEnv(mentioned=True)`); `"judged"`: `reply_judge` decides. A quiet turn stores the message and calls no model; owner and stranger chats always answer',
    )
    reply_judge: ReplyJudge | None = Field(
        default=None,
        description='with `group_reply="judged"`: a `ReplyJudge` (`ReplyScorer()`, offline, when unset; `LLMReplyJudge(model)`)',
    )

    _refuse_unknown = model_validator(mode="before")(refuse_unknown_fields)

    @field_validator("retry", mode="before")
    @classmethod
    def _as_retry_policy(cls, value: Any) -> RetryPolicy | None:
        return retry_policy(value)

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

    @field_validator("max_context_tokens")
    @classmethod
    def _budget_not_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("max_context_tokens: must be 0 (off), a positive number or 'auto'")
        return value

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
        if self.capacity is not None:
            self.capacity.check_tools(self.tool_names)
        if self.reply_judge is not None and self.group_reply != "judged":
            raise ValueError(
                f"reply_judge: only used with group_reply='judged' (it is {self.group_reply!r})"
            )
        return self

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
