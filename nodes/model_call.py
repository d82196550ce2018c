"""`call_model`: one model step with the persona's prompt, knobs, tools and guards.

A round is planned (persona, capacity, guards, view, bound model), the model
is called (the only part that differs between the sync and async twins), and
the reply is finished (stable call ids, response guard, persona label, calls
the loop answers itself, round cap, batch hook).

Transient provider errors are retried by LangGraph's `RetryPolicy` on this
node (`retry_policy`), then the fallback models are tried
(`nodes.model_attempts`). A retried attempt plans the round again, but its
side effects (capacity events, the `after_batch` hook) ran on the first
attempt and are not repeated; nothing is written until an attempt succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.constants import TAG_NOSTREAM
from langgraph.runtime import Runtime
from langgraph.types import RetryPolicy

from memory.transcript import last_human, message_text
from nodes.capacity import CapacityEvent
from nodes.context import env_of, view_of_state
from nodes.env import SessionEnv
from nodes.guards import Block, first_request_block, first_response_block
from nodes.knobs import Knobs, provider_of, request_kwargs
from nodes.loop import Loop, resolve_model
from nodes.model_attempts import ModelAttempts, ModelCall, node_attempt
from nodes.offload import finish_blocks, off_loop, plan_blocks
from nodes.provider_errors import is_transient
from nodes.replies import closing_results, with_stable_call_ids
from nodes.state import LoopState
from nodes.thinking import ThinkingGate
from nodes.tool_policy import round_limit_result, run_hook, was_executed
from nodes.transcript import (
    annotated,
    current_round,
    last_batch,
    latest_user_text,
    runnable_calls,
    turn_number,
)

if TYPE_CHECKING:
    from nodes.config import LoopConfig

log = logging.getLogger("cyrene.model")


@dataclass
class RoundPlan:
    """Everything decided before the model is called."""

    env: SessionEnv
    persona_id: str | None
    round: int
    view: Sequence[BaseMessage] = field(default_factory=list)
    model: Runnable | None = None
    tools: list[BaseTool] = field(default_factory=list)
    knobs: Knobs = field(default_factory=Knobs)
    buffered: bool = False
    update: dict[str, Any] = field(default_factory=dict)
    """State written this round besides the reply (capacity; a blocked request's refusal)."""


def advertised_tools(loop: Loop, env: SessionEnv, awake: dict[str, int] | None) -> list[str]:
    """Tool names bound this round: restricted sessions see only `restricted_tools`."""
    names = loop.config.tool_names
    if env.restricted:
        names = [n for n in names if n in loop.config.restricted_tools]
    if loop.config.capacity is not None:
        names = loop.config.capacity.advertised(awake or {}, names)
    return names


def emit_capacity_events(
    loop: Loop, events: list[CapacityEvent], session_id: str | None, writer: Callable | None
) -> None:
    for event in events:
        event = replace(event, session_id=session_id)
        run_hook("on_capacity", loop.config.on_capacity, event)
        if writer is not None:
            writer(event.to_dict())


def step_capacity(
    loop: Loop,
    messages: Sequence[BaseMessage],
    awake: dict | None,
    round_: int,
    batch: tuple[list[ToolCall], list[ToolMessage]],
) -> tuple[dict[str, int] | None, list[CapacityEvent]]:
    """Wake tiers by trigger (first round) or by use (the batch that just ran).

    Only calls that actually ran count as use: a restricted denial or a veto
    is a soft result, so it can never wake a tier.
    """
    policy = loop.config.capacity
    if policy is None:
        return awake, []
    calls, results = batch
    executed = {r.tool_call_id for r in results if was_executed(r)}
    used = [c["name"] for c in calls if c["id"] in executed]
    return policy.step(
        awake,
        turn=turn_number(messages),
        user_text=latest_user_text(messages) if round_ == 1 else None,
        used_tools=used,
    )


def blocked_request_update(
    loop: Loop, plan: RoundPlan, messages: Sequence[BaseMessage], block: Block
) -> dict:
    """Hide the blocked message from every future model view and answer with a refusal."""
    log.warning("request blocked by guard %s: %s", block.guard, block.reason)
    blocked = {"hidden": True, "blocked_by": block.guard, "reason": block.reason}
    refusal = AIMessage(loop.config.refusal_text, name=_label_for(plan))
    human = last_human(messages)
    hidden = [annotated(human, **blocked)] if human is not None else []
    return {"messages": [*hidden, annotated(refusal, **blocked)]}


def _label_for(plan: RoundPlan) -> str | None:
    """Replies are labelled with the persona id, except in restricted sessions (DESIGN §6)."""
    return None if plan.env.restricted else plan.persona_id


def plan_round(
    loop: Loop, state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
) -> RoundPlan:
    env = env_of(runtime)
    messages: Sequence[BaseMessage] = state["messages"]
    plan = RoundPlan(env=env, persona_id=loop.persona_for(env), round=current_round(messages) + 1)
    # A retry re-plans the same round: the events and the hook already ran on attempt 1.
    first_attempt = (node_attempt(runtime) or 1) == 1

    batch = last_batch(messages) if plan.round > 1 else ([], [])
    awake, events = step_capacity(loop, messages, state.get("capacity"), plan.round, batch)
    if loop.config.capacity is not None:
        plan.update["capacity"] = awake
        if first_attempt:
            emit_capacity_events(loop, events, loop.session_id(env, config), runtime.stream_writer)
    if batch[0] and first_attempt:  # a batch ran (not the loop's answers to a cut-off reply)
        run_hook("after_batch", loop.config.hooks.after_batch, *batch, env)

    guards = loop.config.guards
    block = first_request_block(guards, latest_user_text(messages)) if plan.round == 1 else None
    if block is not None:
        plan.update.update(blocked_request_update(loop, plan, messages, block))
        return plan

    plan.view = state.get("model_view") or view_of_state(loop, env, state)
    plan.knobs = loop.knobs_for(plan.persona_id)
    plan.tools = [loop.tools_by_name[n] for n in advertised_tools(loop, env, awake)]
    plan.model = bound_model(plan, loop.model_for(plan.persona_id))
    plan.buffered = any(g.checks_responses for g in guards)
    return plan


def bound_model(plan: RoundPlan, model: BaseChatModel) -> Runnable:
    """`model` with this round's tools and the knobs in its provider's spelling."""
    bound: Runnable = model.bind_tools(plan.tools) if plan.tools else model
    if kwargs := request_kwargs(provider_of(model), plan.knobs):
        bound = bound.bind(**kwargs)
    return bound


def finish_round(loop: Loop, plan: RoundPlan, response: BaseMessage) -> dict:
    """Vet, label and close the reply; return the node's state update."""
    reply = response if isinstance(response, AIMessage) else AIMessage(message_text(response))
    reply = with_stable_call_ids(reply, plan.view)  # before anything pairs a result with a call
    if loop.config.guards and (
        block := first_response_block(loop.config.guards, message_text(reply))
    ):
        log.warning("response blocked by guard %s: %s", block.guard, block.reason)
        refusal = AIMessage(loop.config.refusal_text, id=reply.id)
        reply = annotated(refusal, blocked_by=block.guard, reason=block.reason)
    if label := _label_for(plan):
        reply = reply.model_copy(update={"name": label})
    closing: list[ToolMessage] = closing_results(reply)  # cut off or unparseable: never run
    if calls := runnable_calls(reply):
        if plan.round >= loop.config.max_rounds:
            closing += [round_limit_result(c, loop.config.max_rounds) for c in calls]
        else:
            run_hook("before_batch", loop.config.hooks.before_batch, calls, plan.env)
    return {**plan.update, "messages": [reply, *closing]}


def model_call(
    loop: Loop,
    plan: RoundPlan,
    model: Runnable,
    view: Sequence[BaseMessage],
    config: RunnableConfig,
) -> ModelCall:
    """What to invoke, with which config, and how to turn its result into the transcript's reply."""
    timeout = loop.config.model_timeout
    if plan.buffered:
        # Replies a response guard must vet are not streamed: a streamed token can't be unsaid.
        tagged: RunnableConfig = {**config, "tags": [*config.get("tags", []), TAG_NOSTREAM]}
        return ModelCall(model, view, tagged, _same, timeout)
    if not plan.knobs.show_thinking:
        gate = ThinkingGate(inner=model)
        return ModelCall(gate, view, config, gate.transcript_message, timeout)
    return ModelCall(model, view, config, _same, timeout)


def _same(message: BaseMessage) -> BaseMessage:
    return message


def fallback_view(
    loop: Loop, plan: RoundPlan, state: LoopState, model: BaseChatModel
) -> Sequence[BaseMessage]:
    """The round's view as `model` must be sent it: re-assembled when its provider needs
    another attribution encoding or name handling than the persona's model."""
    fallback_loop = replace(loop, default_model=model, persona_models={})

    def shape(of: Loop) -> tuple[str, bool]:
        return of.encoding_for(plan.persona_id), of.provider_for(plan.persona_id) == "openai"

    if shape(fallback_loop) == shape(loop):
        return plan.view
    return view_of_state(fallback_loop, plan.env, state)


def model_attempts(
    loop: Loop,
    plan: RoundPlan,
    state: LoopState,
    config: RunnableConfig,
    runtime: Runtime[SessionEnv],
    fallbacks: Sequence[BaseChatModel],
) -> ModelAttempts:
    """This node attempt's calls: the persona's model, then each fallback (`nodes.model_attempts`)."""
    primary = plan.model
    assert primary is not None, "a planned round has a model"

    def calls() -> Iterator[ModelCall]:
        yield model_call(loop, plan, primary, plan.view, config)
        for model in fallbacks:
            view = fallback_view(loop, plan, state, model)
            yield model_call(loop, plan, bound_model(plan, model), view, config)

    attempt = node_attempt(runtime)
    final = attempt is None or attempt > loop.config.model_retries
    return ModelAttempts(calls(), attempt or 1, final)


def retry_policy(config: LoopConfig) -> RetryPolicy | None:
    """The `call_model` node's retries: transient errors only, exponential backoff (None = off)."""
    if config.model_retries == 0:
        return None
    return RetryPolicy(
        max_attempts=config.model_retries + 1,
        initial_interval=config.retry_initial_interval,
        backoff_factor=config.retry_backoff,
        max_interval=config.retry_max_interval,
        jitter=config.retry_jitter,
        retry_on=is_transient,
    )


def make_call_model(loop: Loop) -> tuple[Callable, Callable]:
    """The sync and async twins of the `call_model` node (fallback models resolve here, at build)."""
    fallbacks = [
        resolve_model(model, f"fallback_models[{i}]")
        for i, model in enumerate(loop.config.fallback_models)
    ]
    plan_hops, finish_hops = plan_blocks(loop.config), finish_blocks(loop.config)

    def call_model(state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        plan = plan_round(loop, state, config, runtime)
        if plan.model is None:
            return plan.update
        attempts = model_attempts(loop, plan, state, config, runtime, fallbacks)
        while (call := attempts.next_call()) is not None:
            try:
                response = call.invoke()
            except Exception as exc:
                if attempts.failed(exc):
                    raise
                continue
            return finish_round(loop, plan, response)
        raise attempts.give_up()

    async def acall_model(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        # Planning and finishing may search Chroma, write event logs and run
        # user hooks: blocking work that belongs off the event loop (only then).
        plan = await off_loop(plan_hops, config, plan_round, loop, state, config, runtime)
        if plan.model is None:
            return plan.update
        attempts = model_attempts(loop, plan, state, config, runtime, fallbacks)
        while (call := attempts.next_call()) is not None:
            try:
                response = await call.ainvoke()
            except Exception as exc:
                if attempts.failed(exc):
                    raise
                continue
            return await off_loop(finish_hops, config, finish_round, loop, plan, response)
        raise attempts.give_up()

    return call_model, acall_model
