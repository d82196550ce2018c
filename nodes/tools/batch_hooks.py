"""The caller's batch hooks: around each batch of tool calls.

`before_batch` sees the calls a reply asks for, once it is settled which will
run (after the round limit and the calls the loop answers itself);
`after_batch` sees the batch and its results, before the next model call. A
hook that raises is logged and the turn goes on (`run_hook`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.core.policy import Reply, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.hooks import run_hook
from nodes.kernel.transcript import last_batch
from nodes.tools.hooks import ToolHooks
from nodes.tools.settings import ToolCalls

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class BatchHooks(RoundPolicy):
    """Before the model: `after_batch` for the batch that just ran (on the node's first
    attempt only: a retry re-plans the same round). After the model: `before_batch`."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        hooks = loop.feature(ToolCalls).hooks
        on = hooks.before_batch is not None or hooks.after_batch is not None
        return [cls(hooks)] if on else []

    def __init__(self, hooks: ToolHooks) -> None:
        self.hooks = hooks

    def before_model(self, round: Round) -> None:
        if round.number == 1 or not round.first_attempt or self.hooks.after_batch is None:
            return
        calls, results = last_batch(round.messages)
        if calls:  # a batch ran, not the loop's answers to a cut-off reply
            run_hook("after_batch", self.hooks.after_batch, calls, results, round.env)

    def after_model(self, round: Round, reply: Reply) -> None:
        if self.hooks.before_batch is not None and (calls := reply.calls_to_run()):
            run_hook("before_batch", self.hooks.before_batch, calls, round.env)
