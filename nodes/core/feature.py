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
from collections.abc import Sequence
from functools import cache
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator


def refuse_unknown_fields(
    cls: type[BaseModel], data: Any, moved: dict[str, str] | None = None
) -> Any:
    """Refuse a field the model does not have, naming the closest real one (or, for a
    name in `moved`, where it went): a typo such as `max_context_tokenz=5` must fail, not
    leave the real knob at its default."""
    if isinstance(data, dict):
        moved = moved or {}
        known = [*cls.model_fields, *moved]
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
            raise ValueError(f"{cls.__name__}: unknown field {name!r}{hint}")
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
        return refuse_unknown_fields(cls, data)

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
