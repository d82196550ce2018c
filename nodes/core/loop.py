"""`Loop`: a `LoopConfig` resolved once at build time, shared by every node.

Resolving up front (chat models from "provider:model" strings, the time zone,
tools by name) means a bad value fails in `build_graph`, not mid-turn, and the
nodes stay thin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver

from nodes.core.protocols import TranscriptArchive
from nodes.kernel.compat.sdk_clients import single_attempt
from nodes.kernel.extras import missing_extra
from nodes.kernel.messages import last_human
from nodes.kernel.providers import Provider, provider_of, with_stream_usage
from nodes.kernel.run_config import thread_id

if TYPE_CHECKING:
    from nodes.core.config import LoopConfig, Persona
    from nodes.core.env import SessionEnv
    from nodes.core.feature import Feature

FeatureT = TypeVar("FeatureT", bound="Feature")

log = logging.getLogger("cyrene.loop")
TRACE_SESSION, TRACE_ACTOR, TRACE_PERSONA, TRACE_ROUND = (
    "cyrene_session_id",
    "cyrene_actor",
    "cyrene_persona",
    "cyrene_round",
)
"""The run metadata keys `trace_facts` and each model call set (docs/tracing.md)."""
UNBOUND_ACTOR = "unbound"
"""`TRACE_ACTOR` of an edit (`update_state`) to a thread no turn has opened yet: who it
comes from is not known, so a trace keeps none of its text."""
PROVIDER_EXTRAS = ("openai", "anthropic", "ollama")
"""Providers whose LangChain package one of our extras installs (pyproject.toml)."""


def resolve_model(model: BaseChatModel | str, field_name: str) -> BaseChatModel:
    """A chat model from an instance or a "provider:model" string (via `init_chat_model`)."""
    if isinstance(model, BaseChatModel):
        return model
    from langchain.chat_models import init_chat_model

    try:
        return init_chat_model(model)
    except ImportError as exc:  # the provider's LangChain package: one of our extras
        provider = model.partition(":")[0]
        extra = provider if provider in PROVIDER_EXTRAS else None
        hint = missing_extra(extra, f"{model!r}") if extra else str(exc)
        raise ValueError(f"{field_name}: cannot load chat model {model!r}: {hint}") from exc
    except Exception as exc:  # a missing API key, a bad name
        raise ValueError(f"{field_name}: cannot load chat model {model!r}: {exc}") from exc


def for_call_model(model: BaseChatModel, timeout: float | None) -> BaseChatModel:
    """`model` as `call_model` sends it: its SDK makes one attempt per call, within
    `timeout` (LangGraph's `RetryPolicy` on the node is the only retry), and an
    OpenAI-family model asks for usage in its streams."""
    model = single_attempt(model, timeout)
    return with_stream_usage(model) if provider_of(model) == "openai" else model


def answering_model(
    model: BaseChatModel | str, field_name: str, config: LoopConfig
) -> BaseChatModel:
    """A model the loop answers with, resolved and prepared as `call_model` sends it."""
    return for_call_model(resolve_model(model, field_name), config.model_timeout)


@dataclass
class Loop:
    """Resolved configuration plus the small lookups every node needs."""

    config: LoopConfig
    zone: ZoneInfo | None
    default_model: BaseChatModel
    persona_models: dict[str, BaseChatModel] = field(default_factory=dict)
    tools_by_name: dict[str, BaseTool] = field(default_factory=dict)
    archives: Callable[[BaseCheckpointSaver], TranscriptArchive | None] = lambda saver: None
    """The transcript archive beside a saver's checkpoints (the graph layer provides it)."""
    providers: dict[int, tuple[BaseChatModel, Provider]] = field(default_factory=dict, repr=False)
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    """Values a feature works out once per built graph (compaction's token allowances, the
    background extraction's handle): `remembered`."""

    @classmethod
    def from_config(
        cls,
        config: LoopConfig,
        archives: Callable[[BaseCheckpointSaver], TranscriptArchive | None] = lambda saver: None,
    ) -> Loop:
        return cls(
            config=config,
            zone=config.zone(),
            default_model=answering_model(config.model, "model", config),
            persona_models={
                pid: answering_model(p.model, f"personas[{pid!r}].model", config)
                for pid, p in config.personas.items()
                if p.model is not None
            },
            tools_by_name={t.name: t for t in config.all_tools},
            archives=archives,
        )

    def feature(self, kind: type[FeatureT]) -> FeatureT:
        """The settings of the feature `kind` (`LoopConfig.feature`)."""
        return self.config.feature(kind)

    # -- persona ---------------------------------------------------------
    def persona_for(self, env: SessionEnv) -> str | None:
        """The env's persona if known, else the default; restricted → default."""
        default = self.config.default_persona
        if env.restricted or not env.persona_id:
            return default
        if env.persona_id in self.config.personas:
            return env.persona_id
        log.info("unknown persona %r; answering as %r", env.persona_id, default)
        return default

    def persona(self, persona_id: str | None) -> Persona | None:
        return self.config.personas.get(persona_id) if persona_id else None

    def display_name(self, persona_id: str) -> str:
        """Display name for attribution labels; '' when unknown (the label falls back to the id)."""
        persona = self.persona(persona_id)
        return persona.name if persona else ""

    def model_for(self, persona_id: str | None) -> BaseChatModel:
        return self.persona_models.get(persona_id or "", self.default_model)

    def remembered(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` the first time `key` is asked for, the same value after."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def provider_for(self, persona_id: str | None) -> Provider:
        """The provider family of the persona's model."""
        return self.family(self.model_for(persona_id))

    def family(self, model: BaseChatModel) -> Provider:
        """A model's provider family, worked out once per model (LangChain's answer costs
        ~50 µs a call). Keyed by the model, so a `replace`d Loop shares it safely."""
        known = self.providers.get(id(model))
        if known is None or known[0] is not model:
            known = self.providers[id(model)] = (model, provider_of(model))
        return known[1]

    # -- run facts -------------------------------------------------------
    def now(self) -> datetime:
        return self.config.clock()

    def trace_facts(self, env: SessionEnv, config: RunnableConfig | None) -> dict[str, Any]:
        """What a trace of the run says about it: LangChain metadata every run of the turn
        inherits (OpenTelemetry attributes via `graph.tracing`, LangSmith metadata). Ids and
        names only, never text: a restricted session's words stay out of traces."""
        return {
            TRACE_SESSION: self.session_id(env, config),
            TRACE_ACTOR: env.actor,
            TRACE_PERSONA: self.persona_for(env),
        }

    @staticmethod
    def session_id(env: SessionEnv, config: RunnableConfig | None) -> str | None:
        """`SessionEnv.session_id`, else the thread id."""
        if env.session_id:
            return env.session_id
        return thread_id(config)

    @staticmethod
    def turn_id(env: SessionEnv, messages: Sequence[BaseMessage]) -> str | None:
        """`SessionEnv.turn_id`, else the id of the turn's inbound human message."""
        if env.turn_id:
            return env.turn_id
        human = last_human(messages)
        return human.id if human else None
