"""The round's view: what the model is sent, assembled fresh every round.

The assembly itself (persona, time, working memory, memories, summary, role
declaration, the conversation with speaker notes) is `nodes.context.assemble`;
this policy puts it on the round. A graph that runs `assemble_context` as a
step of its own has the view in state already, and it is used as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.context.assemble import view_blocks, view_of_state
from nodes.core.policy import Round, RoundPolicy
from nodes.core.stages import Stages

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class ContextView(RoundPolicy):
    """Before the model: the view, searching memory and running `ModelView.transform`
    (both may block)."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop)]

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.blocking = view_blocks(loop)

    def before_model(self, round: Round) -> None:
        assembled = round.state.get("model_view")
        round.view = (
            list(assembled)
            if assembled
            else view_of_state(self.loop, round.env, round.state, config=round.config)
        )
