"""`call_model`: one model round, folded over the loop's round policies.

    plan    each policy's `before_model` shapes the `Round` (capacity, guards,
            view, tools), or answers it without a model call
    call    the model, wrapped by each policy's `wrap_model_call` (fallback
            models, thinking knobs and gate)
    finish  each policy's `after_model` completes the `Reply` (call ids, guards,
            label, results for calls that never run)

The chain and its order are `nodes.loop.chain`; a new per-round behaviour
is a new policy there (or in `LoopConfig.policies`), not a branch here.

Transient provider errors are retried by LangGraph's `RetryPolicy` on this
node (`LoopConfig.retry`). A retried attempt plans the round again; policies
with side effects (events, hooks) run them on the first attempt only, and
nothing is written until an attempt succeeds.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.constants import TAG_NOSTREAM
from langgraph.runtime import Runtime

from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import TRACE_ROUND, Loop
from nodes.core.policy import ModelCall, Reply, Round
from nodes.core.stages import Stages
from nodes.core.state import LoopState
from nodes.kernel.compat import RunnableCallable
from nodes.kernel.messages import message_text
from nodes.kernel.steps import Steps, Work, adrive, drive
from nodes.kernel.transcript import current_round
from nodes.loop.chain import PolicyChain, round_policies


def node_attempt(runtime: Runtime[Any] | None) -> int | None:
    """Which execution of the node this is (1 on the first run, 2 on the first retry, …),
    or None outside LangGraph's runner."""
    info = getattr(runtime, "execution_info", None)
    return info.node_attempt if info is not None else None


def new_round(
    loop: Loop, state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
) -> Round:
    """The round this attempt of the node runs, before any policy has shaped it."""
    env = env_of(runtime)
    attempt = node_attempt(runtime)
    retry = loop.config.retry
    return Round(
        state=state,
        env=env,
        config=config,
        persona_id=loop.persona_for(env),
        number=current_round(state["messages"]) + 1,
        session_id=loop.session_id(env, config),
        attempt=attempt or 1,
        final_attempt=attempt is None or retry is None or attempt >= retry.max_attempts,
        writer=runtime.stream_writer,
        runtime=runtime,
    )


def first_request(loop: Loop, round: Round) -> ModelCall:
    """The persona's model with the round's view and tools; a reply that is not streamed
    is tagged so that LangGraph's `messages` stream skips its tokens."""
    metadata = {**round.config.get("metadata", {}), TRACE_ROUND: round.number}
    config: RunnableConfig = {**round.config, "metadata": metadata}
    if not round.streamed:
        config = {**config, "tags": [*config.get("tags", []), TAG_NOSTREAM]}
    return ModelCall(
        model=loop.model_for(round.persona_id),
        view=round.view,
        tools=round.tools,
        config=config,
        timeout=loop.config.model_timeout,
    )


def finish_round(chain: PolicyChain, round: Round, response: BaseMessage) -> dict[str, Any]:
    """The node's update: the completed reply, the results for calls it never runs, and
    what the policies wrote."""
    message = response if isinstance(response, AIMessage) else AIMessage(message_text(response))
    reply = chain.finish(round, Reply(message))
    written = round.update.get("messages", [])  # a compaction's removals go first
    return {**round.update, "messages": [*written, reply.message, *reply.closing, *reply.follow]}


def round_steps(
    loop: Loop,
    chain: PolicyChain,
    state: LoopState,
    config: RunnableConfig,
    runtime: Runtime[SessionEnv],
) -> Steps[dict[str, Any]]:
    """One round as steps: the folds that may block are `Work`, the calls `Invoke`."""
    round = new_round(loop, state, config, runtime)
    yield Work(chain.plan, (round,), chain.before_blocks)
    if round.answered:
        return round.update
    response = yield from chain.call(round, first_request(loop, round))
    return (yield Work(finish_round, (chain, round, response), chain.after_blocks))


def make_call_model(loop: Loop, stages: Stages) -> RunnableCallable:
    """The `call_model` node: one implementation, driven in place or awaited."""
    chain = round_policies(loop, stages)

    def call_model(state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        return drive(round_steps(loop, chain, state, config, runtime))

    async def acall_model(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict:
        """Call the persona's model with this round's view and the tools it may use."""
        return await adrive(round_steps(loop, chain, state, config, runtime))

    return RunnableCallable(call_model, acall_model, name="call_model", trace=False)
