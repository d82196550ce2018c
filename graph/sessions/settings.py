"""`Sessions`: what happens to a message sent while its session runs a turn.

One turn at a time per session is not a setting (`graph.sessions.gate`); what a
message that finds its session busy does is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from nodes.core.feature import Feature

BusyPolicy = Literal["merge", "enqueue", "reject"]


class Sessions(Feature):
    """Messages that arrive during a turn are answered, never lost.

    Example:
        >>> LoopConfig(model=model, features=[Sessions(busy_policy="enqueue", busy_timeout=60)])
    """

    busy_policy: BusyPolicy = Field(
        default="merge",
        description='a message sent while its session runs a turn: `"merge"` waits, and one next turn answers every waiting message (each keeps its speaker); `"enqueue"` waits for a turn of its own, in arrival order; `"reject"` raises `SessionBusyError` at once',
    )
    busy_timeout: float = Field(
        default=300.0,
        gt=0,
        description="seconds a message may wait for its session; then `SessionWaitTimeout` (a `TimeoutError`) and the message is not stored",
    )
