"""The graph's state: the loop's own keys (`LoopState`), each feature's, each middleware's.

Every built-in feature's keys are there whether the config turns the feature on
or not, so a session's checkpoints read the same under any config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodes.capacity.policy import CapacityPolicy
from nodes.core.state import LoopState
from nodes.extraction.settings import Extraction
from nodes.middleware.state import state_with
from nodes.presence.settings import GroupPresence
from nodes.token_accounting.state import TokenUsageState
from nodes.turn_end.settings import TurnEnd
from nodes.vision.settings import Vision

FEATURE_STATES: tuple[type, ...] = (
    *(kind.state_schema for kind in (GroupPresence, CapacityPolicy, Vision, Extraction, TurnEnd)),
    TokenUsageState,
)
"""The state schema of each built-in feature that keeps keys in a session."""


def session_state(middleware: Sequence[Any]) -> type:
    """The graph's state schema: `LoopState`, every feature's keys, every middleware's."""
    return state_with(LoopState, [*FEATURE_STATES, *(m.state_schema for m in middleware)])
