"""`call_model`: one model step with the persona's prompt, knobs, tools and guards.

A round is planned (persona, capacity, guards, view, bound model), the model
is called (the only part that differs between the sync and async twins), and
the reply is finished (response guard, persona label, round cap, batch hook).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import run_in_executor
from langgraph.constants import TAG_NOSTREAM
from langgraph.runtime import Runtime

from memory.transcript import last_human, message_text
from nodes.capacity import CapacityEvent
from nodes.context import env_of, view_of_state
from nodes.env import SessionEnv
from nodes.guards import Block, first_request_block, first_response_block
from nodes.knobs import Knobs, request_kwargs
from nodes.loop import Loop
from nodes.thinking import ThinkingGate
from nodes.tool_policy import round_limit_result, run_hook, was_executed
from nodes.transcript import annotated, current_round, last_batch, latest_user_text, turn_number

log = logging.getLogger("cyrene.model")


@dataclass
class RoundPlan:
    """Everything decided before the model is called."""

    env: SessionEnv
    persona_id: str | None
    round: int
    view: list[BaseMessage] = field(default_factory=list)
    model: Runnable | None = None
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
    messages: list[BaseMessage],
    awake: dict | None,
    round_: int,
    batch: tuple[list[dict], list[ToolMessage]],
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


def blocked_request_update(loop: Loop, plan: RoundPlan, messages: list, block: Block) -> dict:
    """Hide the blocked message from every future model view and answer with a refusal."""
    log.warning("request blocked by guard %s: %s", block.guard, block.reason)
    blocked = {"hidden": True, "blocked_by": block.guard, "reason": block.reason}
    refusal = AIMessage(loop.config.refusal_text, name=_label_for(plan))
    return {"messages": [annotated(last_human(messages), **blocked), annotated(refusal, **blocked)]}


def _label_for(plan: RoundPlan) -> str | None:
    """Replies are labelled with the persona id, except in restricted sessions (DESIGN §6)."""
    return None if plan.env.restricted else plan.persona_id


def plan_round(
    loop: Loop, state: dict, config: RunnableConfig, runtime: Runtime[SessionEnv]
) -> RoundPlan:
    env = env_of(runtime)
    messages: list[BaseMessage] = state["messages"]
    plan = RoundPlan(env=env, persona_id=loop.persona_for(env), round=current_round(messages) + 1)

    batch = last_batch(messages) if plan.round > 1 else ([], [])
    awake, events = step_capacity(loop, messages, state.get("capacity"), plan.round, batch)
    if loop.config.capacity is not None:
        plan.update["capacity"] = awake
        emit_capacity_events(loop, events, loop.session_id(env, config), runtime.stream_writer)
    if plan.round > 1:
        run_hook("after_batch", loop.config.hooks.after_batch, *batch, env)

    guards = loop.config.guards
    block = first_request_block(guards, latest_user_text(messages)) if plan.round == 1 else None
    if block is not None:
        plan.update.update(blocked_request_update(loop, plan, messages, block))
        return plan

    plan.view = state.get("model_view") or view_of_state(loop, env, state)
    plan.knobs = loop.knobs_for(plan.persona_id)
    model = loop.model_for(plan.persona_id)
    tools = [loop.tools_by_name[n] for n in advertised_tools(loop, env, awake)]
    bound: Runnable = model.bind_tools(tools) if tools else model
    if kwargs := request_kwargs(loop.provider_for(plan.persona_id), plan.knobs):
        bound = bound.bind(**kwargs)
    plan.model = bound
    plan.buffered = any(g.checks_responses for g in guards)
    return plan


def finish_round(loop: Loop, plan: RoundPlan, response: BaseMessage) -> dict:
    """Vet, label and close the reply; return the node's state update."""
    reply = response if isinstance(response, AIMessage) else AIMessage(message_text(response))
    if loop.config.guards and (
        block := first_response_block(loop.config.guards, message_text(reply))
    ):
        log.warning("response blocked by guard %s: %s", block.guard, block.reason)
        refusal = AIMessage(loop.config.refusal_text, id=reply.id)
        reply = annotated(refusal, blocked_by=block.guard, reason=block.reason)
    if label := _label_for(plan):
        reply = reply.model_copy(update={"name": label})
    closing: list[ToolMessage] = []
    if reply.tool_calls:
        if plan.round >= loop.config.max_rounds:
            closing = [round_limit_result(c, loop.config.max_rounds) for c in reply.tool_calls]
        else:
            run_hook("before_batch", loop.config.hooks.before_batch, reply.tool_calls, plan.env)
    return {**plan.update, "messages": [reply, *closing]}


def model_call(
    plan: RoundPlan, config: RunnableConfig
) -> tuple[Runnable, RunnableConfig, Callable[[BaseMessage], BaseMessage]]:
    """What to invoke, with which config, and how to turn its result into the transcript's reply."""
    if plan.buffered:
        # Replies a response guard must vet are not streamed: a streamed token can't be unsaid.
        return plan.model, {**config, "tags": [*config.get("tags", []), TAG_NOSTREAM]}, _same
    if not plan.knobs.show_thinking:
        gate = ThinkingGate(inner=plan.model)
        return gate, config, gate.transcript_message
    return plan.model, config, _same


def _same(message: BaseMessage) -> BaseMessage:
    return message


def make_call_model(loop: Loop) -> tuple[Callable, Callable]:
    """The sync and async twins of the `call_model` node."""

    def call_model(state: dict, config: RunnableConfig, runtime: Runtime[SessionEnv]) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        plan = plan_round(loop, state, config, runtime)
        if plan.model is None:
            return plan.update
        runnable, call_config, to_reply = model_call(plan, config)
        response = to_reply(runnable.invoke(plan.view, call_config))
        return finish_round(loop, plan, response)

    async def acall_model(
        state: dict, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        # Planning and finishing may search Chroma, write event logs and run
        # user hooks: blocking work that belongs off the event loop.
        plan = await run_in_executor(config, plan_round, loop, state, config, runtime)
        if plan.model is None:
            return plan.update
        runnable, call_config, to_reply = model_call(plan, config)
        response = to_reply(await runnable.ainvoke(plan.view, call_config))
        return await run_in_executor(config, finish_round, loop, plan, response)

    return call_model, acall_model
