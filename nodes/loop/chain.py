"""The loop's round policies, in order, and the folds `call_model` runs over them.

`round_policies` builds the chain from a `LoopConfig` at build time: each
built-in behaviour whose feature the config switches on (one line each in
`BUILT_IN`), then the caller's own `LoopConfig.policies`. Order matters where
policies meet:

    DecidePresence  before, first: a quiet group turn builds no view, wakes no
                    tier and calls no model
    StableCallIds   after: ids before anything pairs or replaces the reply
    WakeTiers       before: capacity, so the tool offer sees awake tiers
    Guardrails      before: a blocked request never costs a view or a call;
                    after: a blocked reply, before it is labelled and closed
    MiddlewareHooks the caller's LangChain middleware, in their order: before the
                    view (it is built from what they wrote), around the loop's
                    own wrappers, after the guards and before labels and limits
    ContextView     before: the view
    ToolOffer       before: the tools
    CompactWhenDue  around, outermost: when due, compacts and sends the new view
                    (not in graphs where `compact` is a step of its own)
    FallbackModels  around: each fallback gets the inner wrappers too, and the
                    compacted state
    TokenAccounting around, inside the fallbacks: each call that returns counts
                    once; outside the gate, which hands back the whole reply
    ThinkingKnobs   around: knobs in the called provider's spelling, the gate
    PromptCacheBreakpoints  around: Anthropic's `cache_control` marks on the
                    called model's copy of the view (`ModelView(layout="cache")`)
    PersonaLabel    after
    ClosingResults  after: calls that must never run
    RoundLimit      after: calls past the last round
    BatchHooks      before: `after_batch`; after: `before_batch`, once it is
                    settled which calls run
    …the caller's policies, in their order
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from langchain_core.messages import BaseMessage
from langgraph.errors import GraphBubbleUp
from langgraph.func import task

from nodes.capacity.policy import WakeTiers
from nodes.compaction.policy import CompactWhenDue
from nodes.context.policy import ContextView
from nodes.core.policy import (
    CallModel,
    CallSteps,
    Invoke,
    ModelCall,
    Reply,
    Round,
    RoundPolicy,
    hooks_block,
)
from nodes.core.stages import Stages
from nodes.fallbacks.policy import FallbackModels
from nodes.guards.policy import Guardrails
from nodes.kernel.steps import Either
from nodes.middleware.hooks import MiddlewareHooks
from nodes.presence.policy import DecidePresence
from nodes.prompt_cache.policy import PromptCacheBreakpoints
from nodes.thinking.policy import ThinkingKnobs
from nodes.token_accounting.policy import TokenAccounting
from nodes.tools.batch_hooks import BatchHooks
from nodes.tools.offer import ToolOffer
from nodes.tools.replies import ClosingResults, PersonaLabel, StableCallIds
from nodes.tools.round_limit import RoundLimit

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.policies")


class Registered(Protocol):
    """A built-in policy: its feature's settings say whether, and how, a loop runs it."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        """The policies of this kind that `loop` runs: none when their feature is off."""
        ...


BUILT_IN: tuple[Registered, ...] = (
    DecidePresence,
    StableCallIds,
    WakeTiers,
    Guardrails,
    MiddlewareHooks,
    ContextView,
    ToolOffer,
    CompactWhenDue,
    FallbackModels,
    TokenAccounting,
    ThinkingKnobs,
    PromptCacheBreakpoints,
    PersonaLabel,
    ClosingResults,
    RoundLimit,
    BatchHooks,
)
"""Each built-in policy, in the chain's order (the module docstring says why): one line of
registration per policy, its feature's settings saying whether it runs (`for_loop`)."""


def round_policies(loop: Loop, stages: Stages) -> PolicyChain:
    """The chain for `loop.config`: the built-in policies it switches on, then the caller's."""
    chain = [policy for kind in BUILT_IN for policy in kind.for_loop(loop, stages)]
    # A middleware's after_model may interrupt (ask a person): its round's reply is then
    # recorded, so the resume continues from that reply instead of calling the model again.
    recorded = any(isinstance(p, MiddlewareHooks) and p.has("after_model") for p in chain)
    return PolicyChain((*chain, *loop.config.policies), record_replies=recorded)


class PolicyChain:
    """The ordered policies, split by hook once, with whether each fold may block."""

    def __init__(self, policies: Sequence[RoundPolicy], *, record_replies: bool = False) -> None:
        self.policies = tuple(policies)
        self.innermost: CallModel = _recorded_invoke if record_replies else _invoke
        self.before = [p for p in self.policies if p.has("before_model")]
        self.around = [p for p in self.policies if p.has("wrap_model_call")]
        self.after = [p for p in self.policies if p.has("after_model")]
        self.before_blocks = hooks_block(self.policies, "before_model")
        self.after_blocks = hooks_block(self.policies, "after_model")

    def plan(self, round: Round) -> Round:
        """`before_model` of each policy, in order, until one answers the round."""
        for policy in self.before:
            _run(policy, "before_model", policy.before_model, round)
            if round.answered:
                break
        return round

    def call(self, round: Round, request: ModelCall) -> CallSteps:
        """The model call, wrapped by each policy, the first outermost."""
        handler = self.innermost
        for policy in reversed(self.around):
            handler = _wrapped(policy, round, handler)
        return (yield from handler(request))

    def finish(self, round: Round, reply: Reply) -> Reply:
        """`after_model` of each policy, in order."""
        for policy in self.after:
            _run(policy, "after_model", policy.after_model, round, reply)
        return reply


def _invoke(request: ModelCall) -> CallSteps:
    return (yield Invoke(request))


def _reply(request: ModelCall) -> BaseMessage:
    return Invoke(request).run()


async def _areply(request: ModelCall) -> BaseMessage:
    return await Invoke(request).arun()


_model_reply: Any = cast(Any, task)(name="model_reply")(_reply)
_amodel_reply: Any = cast(Any, task)(name="model_reply")(_areply)


def _recorded_invoke(request: ModelCall) -> CallSteps:
    """The call as a LangGraph task: its reply is kept with the node's pending writes, and
    a rerun of the node after an interrupt gets it back without a model call."""
    return (yield Either(lambda: _model_reply(request).result(), lambda: _amodel_reply(request)))


def _wrapped(policy: RoundPolicy, round: Round, inner: CallModel) -> CallModel:
    def call(request: ModelCall) -> CallSteps:
        return (yield from policy.wrap_model_call(round, request, inner))

    return call


def _run(policy: RoundPolicy, hook: str, fn: Callable[..., None], *args: Any) -> None:
    """A policy's hook; if it fails, logged, and the round goes on without it."""
    try:
        fn(*args)
    except GraphBubbleUp:
        raise
    except Exception:
        log.exception("round policy %s failed in %s; the round goes on", policy.name, hook)
