"""Token accounting: what each model call cost, per call, per turn and per session.

Each chat model reply carries LangChain's `usage_metadata` when its provider
reports it: input, output and total tokens, with the cached part of the input
in `input_token_details.cache_read` (and cache writes in `cache_creation`).
This policy adds each call's usage to the state's `token_usage`
(`nodes.token_accounting.state.TokenUsage`): the turn's calls, their sum, and the session's
running sum, written with the reply, so a caller reads it from the turn's
result or `get_state`, Studio shows it with the state, and `cyrene history`
prints the session's totals. A running sum costs the same at turn 10,000 as
at turn 10; adding up the transcript would not.

The loop's other model calls (a compactor's, a reply judge's, an extractor's) are
counted beside them by purpose (`nodes.token_accounting.aside`): each adds to the
session's total and to its purpose's in `purposes`; the turn's `calls` and `turn`
are the replies', and the session's replies are its total less its `purposes`.

What is counted, and what is not:
- it wraps the call inside `FallbackModels`, so each call that returns
  counts once, the persona's model's or a fallback's; a call that raised
  (and was retried, or handed to a fallback) returned no usage to count;
- an attempt of `call_model` that fails writes nothing, so a round retried by
  LangGraph is counted by the attempt that succeeds, once;
- a provider that reports nothing adds nothing: no key, not zeros.

Usage is data from outside (a provider, a proxy): only token counts are kept
(`nodes.token_accounting.usage.clean_usage`), so no odd report can fail a turn or a later
one. A session that already holds a bad total is repaired when its next call is
counted (`clean_record`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING, cast

from langchain_core.messages import BaseMessage
from langchain_core.messages.ai import UsageMetadata

from nodes.core.policy import CallModel, CallSteps, ModelCall, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.transcript import turn_start
from nodes.token_accounting.aside import clean_record
from nodes.token_accounting.state import TokenUsage, TokenUsageState
from nodes.token_accounting.usage import clean_usage, storable, summed

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class TokenAccounting(RoundPolicy):
    """Around each model call: its reported usage, added to the turn's and the session's."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls()]

    blocking = False

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        response = yield from call(request)
        reported = getattr(response, "usage_metadata", None)
        usage = clean_usage(reported)
        raw = getattr(response, "response_metadata", None)
        kept = storable(raw)
        if (reported and usage != reported) or kept != raw:  # the reply is stored too
            response = response.model_copy(
                update={"usage_metadata": usage, "response_metadata": kept}
            )
        stored = cast(TokenUsageState, round.state).get("token_usage")
        so_far: TokenUsage | None = round.update.get("token_usage") or clean_record(stored)
        turn_id = opening_id(round.messages)
        stale = so_far is not None and (so_far["turn_id"] != turn_id or so_far != stored)
        if usage is not None or stale:  # a new call, a new turn, or a bad total repaired
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
        record["turn"] = reduce(summed, record["calls"])
    session = so_far.get("session") if so_far is not None else None
    if session is not None or usage is not None:
        record["session"] = summed(session, usage)
    if so_far is not None and "purposes" in so_far:
        record["purposes"] = so_far["purposes"]
    return record
