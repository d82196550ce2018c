"""Which tools the model is offered this round.

Restricted (group and stranger) sessions are offered only `restricted_tools`;
a capacity policy offers only the tools of awake tiers (`WakeTiers` stepped
them earlier in the round). Offering is a view, not a wall: what may *run* is
decided again for every call by `dispatch_tools`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from nodes.capacity.policy import CapacityPolicy, CapacityState
from nodes.core.env import SessionEnv
from nodes.core.policy import Round, RoundPolicy
from nodes.core.stages import Stages

if TYPE_CHECKING:
    from nodes.core.loop import Loop


def offered_tools(loop: Loop, env: SessionEnv, awake: Mapping[str, int] | None) -> list[str]:
    """Tool names bound this round: restricted sessions see only `restricted_tools`."""
    names = loop.config.tool_names
    if env.restricted:
        names = [n for n in names if n in loop.config.restricted_tools]
    if (capacity := loop.feature(CapacityPolicy)).on:
        names = capacity.advertised(awake or {}, names)
    return names


class ToolOffer(RoundPolicy):
    """Before the model: the tools it may call this round."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop)]

    blocking = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def before_model(self, round: Round) -> None:
        awake = round.update.get("capacity", cast(CapacityState, round.state).get("capacity"))
        names = offered_tools(self.loop, round.env, awake)
        round.tools = [self.loop.tools_by_name[name] for name in names]
