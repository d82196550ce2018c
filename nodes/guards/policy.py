"""Request/response guards.

A guard looks at text and returns a reason to block it, or `None`. When a guard
blocks, the turn ends with a short refusal: a blocked request never reaches
the model (now or in later rounds), a blocked response never reaches the user.
`Guardrails` is the round policy that applies the configured guards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from langchain_core.messages import AIMessage

from nodes.core.policy import Reply, Round, RoundPolicy
from nodes.kernel.messages import last_human, message_text
from nodes.kernel.transcript import annotated, latest_user_text

log = logging.getLogger("cyrene.guards")


class Guard:
    """Base class: override `check_request` and/or `check_response`."""

    name: str = "guard"

    def check_request(self, text: str) -> str | None:
        """Return a reason to block the user's text before the model sees it."""
        return None

    def check_response(self, text: str) -> str | None:
        """Return a reason to block the model's reply before the user sees it."""
        return None

    @property
    def checks_responses(self) -> bool:
        """Whether replies must be buffered for this guard (a streamed token can't be unsaid)."""
        return type(self).check_response is not Guard.check_response


class KeywordGuard(Guard):
    """Blocks text containing any of the given words (case-insensitive)."""

    def __init__(self, words: Iterable[str], *, name: str = "keywords", responses: bool = True):
        self.words = tuple(w.casefold() for w in words if w)
        self.name = name
        self._responses = responses

    def _hit(self, text: str) -> str | None:
        folded = text.casefold()
        hit = next((w for w in self.words if w in folded), None)
        return f"contains blocked word {hit!r}" if hit else None

    def check_request(self, text: str) -> str | None:
        return self._hit(text)

    def check_response(self, text: str) -> str | None:
        return self._hit(text) if self._responses else None

    @property
    def checks_responses(self) -> bool:
        return self._responses


@dataclass(frozen=True)
class Block:
    """Which guard blocked, and why."""

    guard: str
    reason: str


def first_request_block(guards: Sequence[Guard], text: str) -> Block | None:
    """The first guard that blocks the request text, if any."""
    return _first_block(guards, text, lambda g: g.check_request)


def first_response_block(guards: Sequence[Guard], text: str) -> Block | None:
    """The first guard that blocks the reply text, if any."""
    return _first_block(guards, text, lambda g: g.check_response)


def _first_block(
    guards: Sequence[Guard], text: str, check: Callable[[Guard], Callable[[str], str | None]]
) -> Block | None:
    # A guard that raises blocks: failing open would let exactly the text it
    # exists to stop slip through whenever it breaks.
    for guard in guards:
        try:
            reason = check(guard)(text)
        except Exception as exc:
            log.exception("guard %s failed; treating the text as blocked", guard.name)
            reason = f"guard failed: {exc!r}"
        if reason:
            return Block(guard.name, reason)
    return None


class Guardrails(RoundPolicy):
    """The guards on a turn: the request before the first model call, every reply after.

    A blocked request is hidden from every later model view and answered with
    `refusal` (no model call); a blocked reply is replaced by `refusal` under
    its id. Replies a response guard must vet are not streamed, since a
    streamed token can't be unsaid. A guard that raises blocks (see `_first_block`).
    """

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
