"""The loop's nodes by name, and `Stages`: where each part of a turn goes.

Which stages a config switches on is decided once, when the graph is built
(`nodes.loop.stages.stages_of`): stages that are off are routed around rather
than run as no-ops, since every superstep costs a checkpoint write.
"""

from __future__ import annotations

from dataclasses import dataclass

VISION, COMPACT, ASSEMBLE, CALL, DISPATCH, EXTRACT, FINISH = (
    "resolve_vision",
    "compact",
    "assemble_context",
    "call_model",
    "dispatch_tools",
    "extract_memory",
    "finish_turn",
)
LOOP_NODES = (VISION, COMPACT, ASSEMBLE, CALL, DISPATCH, EXTRACT, FINISH)


@dataclass(frozen=True)
class Stages:
    """Where each part of a turn goes, given the stages a config switches on."""

    view: str
    """Where a round's view is made: `assemble_context` as a step, or inside `call_model`."""
    round_start: str
    turn_start: str
    after_extract: str
    after_reply: str
    presence: bool
    """Group turns are decided at `call_model` before anything else runs."""

    @property
    def before_model(self) -> bool:
        """Whether a turn runs a stage of its own before `call_model` (vision, the view step)."""
        return self.turn_start != CALL
