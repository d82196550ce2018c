"""Request/response guards: a guard looks at text and returns a reason to block it, or `None`.

`Guards` (the feature's settings) lists them; `Guardrails` (the round policy)
applies them. A guard that raises blocks (`_first_block`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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
