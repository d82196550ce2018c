"""`Guardrails`: the round policy that applies the configured guards (`Guards`).

When a guard blocks, the turn ends with a short refusal: a blocked request never
reaches the model (now or in later rounds), a blocked response never reaches
the user. What a guard is: `nodes.guards.checks`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.messages import AIMessage

from nodes.core.policy import Reply, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.guards.checks import Guard, first_request_block, first_response_block
from nodes.guards.settings import Guards
from nodes.kernel.messages import last_human, message_text
from nodes.kernel.transcript import annotated, latest_user_text

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.guards")


class Guardrails(RoundPolicy):
    """The guards on a turn: the request before the first model call, every reply after.

    A blocked request is hidden from every later model view and answered with
    `refusal` (no model call); a blocked reply is replaced by `refusal` under
    its id. Replies a response guard must vet are not streamed, since a
    streamed token can't be unsaid. A guard that raises blocks (see `_first_block`).
    """

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        settings = loop.feature(Guards)
        return [cls(settings.checks, settings.refusal_text)] if settings.on else []

    def __init__(self, guards: Sequence[Guard], refusal: str) -> None:
        self.guards = tuple(guards)
        self.refusal = refusal
        self.vets_replies = any(g.checks_responses for g in self.guards)

    def before_model(self, round: Round) -> None:
        round.streamed = round.streamed and not self.vets_replies
        if round.number > 1:
            return
        block = first_request_block(self.guards, latest_user_text(round.messages))
        if block is None:
            return
        log.warning("request blocked by guard %s: %s", block.guard, block.reason)
        marks = {"hidden": True, "blocked_by": block.guard, "reason": block.reason}
        human = last_human(round.messages)
        hidden = [annotated(human, **marks)] if human is not None else []
        refusal = AIMessage(self.refusal, name=round.label)
        round.answer(messages=[*hidden, annotated(refusal, **marks)])

    def after_model(self, round: Round, reply: Reply) -> None:
        if not self.vets_replies:
            return
        block = first_response_block(self.guards, message_text(reply.message))
        if block is None:
            return
        log.warning("response blocked by guard %s: %s", block.guard, block.reason)
        refusal = AIMessage(self.refusal, id=reply.message.id)
        reply.message = annotated(refusal, blocked_by=block.guard, reason=block.reason)
