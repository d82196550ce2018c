"""Wake-style progressive capability.

Tools are grouped in tiers. A session starts with the first tier awake; a tier
wakes when the user's message matches one of its triggers, or when the model
calls one of its tools anyway (the filter is a view, not a wall); a tier with
`decay_turns` falls asleep again after that many turns without use. Tools that
no tier lists are always advertised.

The awake set lives in graph state as `{tier name: turn number of its last
wake or use}`, so it is checkpointed and per session. `CapacityPolicy` is the
feature's settings (an entry of `LoopConfig.features`) and its pure stepping;
`WakeTiers` is the round policy that steps it before each model call and reports
the events.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NotRequired, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nodes.core.config import repeated
from nodes.core.feature import Feature
from nodes.core.policy import Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.core.state import LoopState, turn_of
from nodes.kernel.hooks import run_hook
from nodes.kernel.tool_results import was_executed
from nodes.kernel.transcript import last_batch, latest_user_text

if TYPE_CHECKING:
    from nodes.core.loop import Loop

REGEX_PREFIX = "re:"


class Tier(BaseModel):
    """A named group of tools that wake together.

    `triggers` are plain substrings (case-insensitive), or regular expressions
    when written as `"re:<pattern>"` or given as compiled patterns.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1)
    tools: tuple[str, ...] = ()
    triggers: tuple[str | re.Pattern[str], ...] = ()
    decay_turns: int | None = Field(default=None, gt=0)

    @field_validator("triggers", mode="after")
    @classmethod
    def _compile(cls, triggers: tuple[str | re.Pattern[str], ...], info: Any) -> tuple:
        compiled: list[str | re.Pattern[str]] = []
        for trigger in triggers:
            if isinstance(trigger, str) and trigger.startswith(REGEX_PREFIX):
                try:
                    trigger = re.compile(trigger[len(REGEX_PREFIX) :], re.IGNORECASE)
                except re.error as exc:
                    name = info.data.get("name", "?")
                    raise ValueError(
                        f"capacity tier {name!r}: trigger {trigger!r} is not a valid "
                        f"regular expression ({exc})"
                    ) from exc
            compiled.append(trigger)
        return tuple(compiled)

    def triggered_by(self, text: str) -> bool:
        folded = text.casefold()
        return any(
            t.search(text) if isinstance(t, re.Pattern) else t.casefold() in folded
            for t in self.triggers
        )


@dataclass(frozen=True)
class CapacityEvent:
    """A tier waking up or falling asleep."""

    kind: Literal["capacity_awaken", "capacity_sleep"]
    tier: str
    reason: Literal["start", "trigger", "use", "decay"]
    turn: int
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CapacityState(LoopState):
    """The key capacity keeps in a session."""

    capacity: NotRequired[dict[str, int]]
    """Awake capacity tiers → the turn number they were last woken or used in."""


class CapacityPolicy(Feature):
    """Which tools the model is offered, tier by tier (no tiers: every tool, always).

    The first tier is awake from the start and never decays; the others wake
    on a trigger in the user's text or when the model uses one of their tools,
    and fall asleep after `decay_turns` turns without use. Tools no tier lists
    are always offered. The awake set lives in each session's state.

    Args:
        tiers: `Tier`s, names unique; every tool a tier lists must be one of the
            loop's tools (checked when the `LoopConfig` is built).
        on_event: receives each `CapacityEvent` (a tier waking or falling asleep).

    Raises:
        pydantic.ValidationError: repeated tier names, or a `re:` trigger that is
            not a regular expression (a `ValueError`).

    Example:
        >>> LoopConfig(model=model, tools=[get_time, take_note], features=[
        ...     CapacityPolicy(tiers=[Tier(name="base", tools=["get_time"]),
        ...                           Tier(name="notes", tools=["take_note"],
        ...                                triggers=["笔记", "re:\\bnote\\b"], decay_turns=3)])])
    """

    state_schema = CapacityState

    tiers: tuple[Tier, ...] = Field(
        default=(),
        description="`Tier(name, tools, triggers, decay_turns)`s: wake-style tool tiers; the first is awake from the start and never sleeps, the others wake on a trigger in the user's text or when the model calls one of their tools, and sleep after `decay_turns` turns unused; tools no tier lists are always offered; none = every tool is offered",
    )
    on_event: Callable[[CapacityEvent], None] | None = Field(
        default=None, description="receives `capacity_awaken` / `capacity_sleep` events"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> CapacityPolicy:
        if dupes := repeated(t.name for t in self.tiers):
            raise ValueError(f"capacity: tier names must be unique, repeated: {dupes}")
        return self

    @property
    def on(self) -> bool:
        return bool(self.tiers)

    def check_tools(self, tool_names: Sequence[str]) -> None:
        """Fail naming the tier when it lists a tool the loop does not have."""
        known = set(tool_names)
        for tier in self.tiers:
            unknown = sorted(set(tier.tools) - known)
            if unknown:
                raise ValueError(f"capacity tier {tier.name!r}: unknown tools {unknown}")

    def tier_of(self, tool: str) -> Tier | None:
        return next((t for t in self.tiers if tool in t.tools), None)

    def advertised(self, awake: Mapping[str, int], tools: Iterable[str]) -> list[str]:
        """Tool names to bind: those of awake tiers plus those no tier gates."""
        return [
            name for name in tools if (tier := self.tier_of(name)) is None or tier.name in awake
        ]

    def step(
        self,
        awake: Mapping[str, int] | None,
        *,
        turn: int,
        user_text: str | None = None,
        used_tools: Iterable[str] = (),
    ) -> tuple[dict[str, int], list[CapacityEvent]]:
        """Advance the awake set: start, decay, triggers (when `user_text` is given), use."""
        state = dict(awake or {})
        events: list[CapacityEvent] = []
        first = self.tiers[0].name
        if first not in state:
            state[first] = turn
            events.append(CapacityEvent("capacity_awaken", first, "start", turn))
        if user_text is not None:
            for tier in self.tiers[1:]:
                if (
                    tier.decay_turns
                    and tier.name in state
                    and turn - state[tier.name] > tier.decay_turns
                ):
                    del state[tier.name]
                    events.append(CapacityEvent("capacity_sleep", tier.name, "decay", turn))
            for tier in self.tiers:
                if tier.triggered_by(user_text):
                    if tier.name not in state:
                        events.append(CapacityEvent("capacity_awaken", tier.name, "trigger", turn))
                    state[tier.name] = turn
        for tool in used_tools:
            gate = self.tier_of(tool)
            if gate is None:
                continue
            if gate.name not in state:
                events.append(CapacityEvent("capacity_awaken", gate.name, "use", turn))
            state[gate.name] = turn
        return state, events


class WakeTiers(RoundPolicy):
    """Before each model call: wake tiers by trigger (a turn's first round) or by use (the
    batch that just ran), put tiers to sleep that went unused, and report each change
    to `CapacityPolicy.on_event` and the custom stream (on the node's first attempt only).

    Only calls that actually ran count as use: a restricted denial or a veto is
    a soft result, so it can never wake a tier.
    """

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        policy = loop.feature(CapacityPolicy)
        return [cls(policy)] if policy.on else []

    def __init__(self, policy: CapacityPolicy) -> None:
        self.policy = policy
        self.blocking = policy.on_event is not None

    def before_model(self, round: Round) -> None:
        calls, results = last_batch(round.messages) if round.number > 1 else ([], [])
        executed = {r.tool_call_id for r in results if was_executed(r)}
        awake, events = self.policy.step(
            cast(CapacityState, round.state).get("capacity"),
            turn=turn_of(round.state),
            user_text=latest_user_text(round.messages) if round.number == 1 else None,
            used_tools=[c["name"] for c in calls if c["id"] in executed],
        )
        round.update["capacity"] = awake
        if not round.first_attempt:  # a retry re-plans the round: attempt 1 reported it
            return
        for event in events:
            event = replace(event, session_id=round.session_id)
            run_hook("on_event", self.policy.on_event, event)
            round.emit(event.to_dict())
