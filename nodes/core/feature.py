"""`Feature`: one feature's settings, an entry of `LoopConfig(features=[...])`.

Each feature folder defines its own (`nodes.compaction.settings.Compaction`,
`nodes.presence.settings.GroupPresence`, …): its knobs, validated where they are
declared, and the keys it keeps in a session (`state_schema`, a `TypedDict`,
merged into the graph's state as a LangChain middleware's is). A feature left
out of the list runs with its defaults (`LoopConfig.feature(Kind)`), so turning
one on, off or to other settings is one entry in the list:

    LoopConfig(model=model, features=[GroupPresence(reply="mentioned"), Compaction(max_context_tokens=0)])
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator

MOVED_TO_FEATURES = {
    "group_reply": ("GroupPresence", "reply"),
    "reply_judge": ("GroupPresence", "judge"),
    "max_context_tokens": ("Compaction", "max_context_tokens"),
    "compactor": ("Compaction", "compactor"),
    "capacity": ("CapacityPolicy", "tiers"),
    "on_capacity": ("CapacityPolicy", "on_event"),
    "guards": ("Guards", "checks"),
    "refusal_text": ("Guards", "refusal_text"),
    "vision": ("Vision", "describer"),
    "model_accepts_images": ("Vision", "model_accepts_images"),
    "max_image_bytes": ("Vision", "max_image_bytes"),
    "thinking_budget": ("Thinking", "thinking_budget"),
    "reasoning_effort": ("Thinking", "reasoning_effort"),
    "show_thinking": ("Thinking", "show_thinking"),
    "model_accepts_thinking": ("Thinking", "model_accepts_thinking"),
    "fallback_models": ("Fallbacks", "models"),
    "max_rounds": ("ToolCalls", "max_rounds"),
    "tool_execution": ("ToolCalls", "execution"),
    "tool_parallelism": ("ToolCalls", "parallelism"),
    "hooks": ("ToolCalls", "hooks"),
    "on_audit": ("ToolCalls", "on_audit"),
    "context_layout": ("ModelView", "layout"),
    "attribution_encoding": ("ModelView", "attribution_encoding"),
    "memory_k": ("ModelView", "memory_k"),
    "transform_context": ("ModelView", "transform"),
    "model_view_step": ("ModelView", "own_step"),
    "extraction_timeout": ("Extraction", "timeout"),
    "on_turn_end": ("TurnEnd", "hook"),
    "busy_policy": ("Sessions", "busy_policy"),
    "busy_timeout": ("Sessions", "busy_timeout"),
}
"""`LoopConfig` fields that became a feature's settings: old name → (feature, its field)."""


def refuse_unknown_fields(
    cls: type[BaseModel], data: Any, moved: Mapping[str, str] | None = None
) -> Any:
    """Refuse the fields the model does not have, each named with the closest real one (or,
    for a name in `moved`, where it went): a typo such as `max_context_tokenz=5` must fail,
    not leave the real knob at its default."""
    if not isinstance(data, dict):
        return data
    moved = moved or {}
    known = [*cls.model_fields, *moved]
    problems = []
    for name in data:
        if name in cls.model_fields:
            continue
        if place := moved.get(str(name)):
            hint = f"; it is now {place}"
        elif close := difflib.get_close_matches(str(name), known, n=1):
            went = f" (now {moved[close[0]]})" if close[0] in moved else ""
            hint = f"; did you mean {close[0]!r}{went}?"
        else:
            hint = ""
        problems.append(f"unknown field {name!r}{hint}")
    if problems:
        raise ValueError(f"{cls.__name__}: {'; '.join(problems)}")
    return data


class Feature(BaseModel):
    """Base of every feature's settings. Frozen; unknown fields are refused.

    Attributes:
        state_schema: the keys the feature keeps in a session's state (a `TypedDict`),
            or None. Every registered feature's keys are in the graph's state, on or off,
            so a session's checkpoints read the same whichever features a config turns on.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    state_schema: ClassVar[type | None] = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown(cls, data: Any) -> Any:
        # An old `LoopConfig` name given to the feature it went to: say its name here.
        renamed = {
            old: repr(new)
            for old, (kind, new) in MOVED_TO_FEATURES.items()
            if kind == cls.kind().__name__ and old != new
        }
        return refuse_unknown_fields(cls, data, renamed)

    @classmethod
    def kind(cls) -> type[Feature]:
        """The feature this is the settings of: the class right below `Feature` (a subclass of
        `Guards` is still the guards' settings)."""
        return next(k for k in reversed(cls.__mro__) if issubclass(k, Feature) and k is not Feature)

    @classmethod
    def defaults(cls) -> Self:
        """The feature with every setting at its default (made once: settings are frozen)."""
        return _defaults(cls)

    def check_tools(self, tool_names: Sequence[str]) -> None:
        """Check these settings against every tool the loop runs; raise `ValueError` naming
        the feature and field. Called when the `LoopConfig` is built."""


@cache
def _defaults(kind: type[Feature]) -> Any:
    return kind()
