"""A reply made fit to store: usable call ids, the persona's label, calls the loop answers.

The rules are plain functions in `nodes.kernel.replies`; these policies apply
them after every model call, in this order of the chain: ids first (before
anything pairs a result with a call or a guard replaces the reply), the label,
then the results for calls that must never run (a cut-off reply's, and
unparseable ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.core.policy import Reply, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.replies import closing_results, with_stable_call_ids

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class StableCallIds(RoundPolicy):
    """After the model: a usable id, unique in the request, on every call."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls()]

    blocking = False

    def after_model(self, round: Round, reply: Reply) -> None:
        reply.message = with_stable_call_ids(reply.message, round.view)


class PersonaLabel(RoundPolicy):
    """After the model: the reply carries the persona id as its `name`, so a
    persona switched in later on the same thread knows who said what; restricted
    sessions stay unlabelled."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls()]

    blocking = False

    def after_model(self, round: Round, reply: Reply) -> None:
        if round.label:
            reply.message = reply.message.model_copy(update={"name": round.label})


class ClosingResults(RoundPolicy):
    """After the model: the calls of a reply the provider cut off or filtered, and every
    unparseable call, are answered with an error result and never run."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls()]

    blocking = False

    def after_model(self, round: Round, reply: Reply) -> None:
        reply.close(closing_results(reply.message))
