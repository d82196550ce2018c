"""The round limit: a turn makes at most `max_rounds` model calls.

The calls the last round asks for are answered with a `round_limit` result
instead of running, so the turn ends with every call paired.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.core.policy import Reply, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.tool_results import round_limit_result
from nodes.tools.settings import ToolCalls

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class RoundLimit(RoundPolicy):
    """After the model: the last round's calls get `round_limit` results."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop.feature(ToolCalls).max_rounds)]

    blocking = False

    def __init__(self, max_rounds: int) -> None:
        self.max_rounds = max_rounds

    def after_model(self, round: Round, reply: Reply) -> None:
        if round.number >= self.max_rounds and (calls := reply.calls_to_run()):
            reply.close([round_limit_result(call, self.max_rounds) for call in calls])
