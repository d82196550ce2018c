"""Token accounting: what each model call cost, per call, per turn and per session.

Each chat model reply carries LangChain's `usage_metadata` when its provider
reports it: input, output and total tokens, with the cached part of the input
in `input_token_details.cache_read` (and cache writes in `cache_creation`).
This policy adds each call's usage to the state's `token_usage`
(`nodes.state.TokenUsage`): the turn's calls, their sum, and the session's
running sum, written with the reply, so a caller reads it from the turn's
result or `get_state`, Studio shows it with the state, and `cyrene history`
prints the session's totals. A running sum costs the same at turn 10,000 as
at turn 10; adding up the transcript would not.

What is counted, and what is not:
- it wraps the call inside `FallbackModels`, so each call that returns
  counts once, the persona's model's or a fallback's; a call that raised
  (and was retried, or handed to a fallback) returned no usage to count;
- an attempt of `call_model` that fails writes nothing, so a round retried by
  LangGraph is counted by the attempt that succeeds, once;
- a provider that reports nothing adds nothing: no key, not zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from langchain_core.messages import BaseMessage
from langchain_core.messages.ai import UsageMetadata, add_usage

from nodes.policies.base import CallModel, CallSteps, ModelRequest, Round, RoundPolicy
from nodes.state import TokenUsage
from nodes.view.transcript import turn_start


class TokenAccounting(RoundPolicy):
    """Around each model call: its reported usage, added to the turn's and the session's."""

    blocking = False

    def wrap_model_call(self, round: Round, request: ModelRequest, call: CallModel) -> CallSteps:
        response = yield from call(request)
        usage = getattr(response, "usage_metadata", None) or None  # None and {}: nothing
        so_far: TokenUsage | None = round.update.get("token_usage") or round.state.get(
            "token_usage"
        )
        turn_id = opening_id(round.messages)
        if usage is not None or (so_far is not None and so_far["turn_id"] != turn_id):
            round.update["token_usage"] = counted(so_far, usage, turn_id)
        return response


def opening_id(messages: Sequence[BaseMessage]) -> str | None:
    """The id of the current turn's opening message: which turn a call belongs to."""
    return messages[turn_start(messages)].id if messages else None


def counted(
    so_far: TokenUsage | None, usage: UsageMetadata | None, turn_id: str | None
) -> TokenUsage:
    """`so_far` with one more call (`usage` None: it reported nothing). A new turn starts
    its record afresh, so `turn` is never an earlier turn's."""
    same_turn = so_far is not None and so_far["turn_id"] == turn_id
    calls = [*(so_far["calls"] if so_far is not None and same_turn else []), usage]
    record = TokenUsage(turn_id=turn_id, calls=[c for c in calls if c is not None])
    if record["calls"]:
        record["turn"] = reduce(add_usage, record["calls"])
    session = so_far.get("session") if so_far is not None else None
    if session is not None or usage is not None:
        record["session"] = add_usage(session, usage)
    return record
