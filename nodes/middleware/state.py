"""The session state with the keys each middleware's `state_schema` brings.

As `create_agent` does, the schemas are merged into one `TypedDict`; the loop's
own keys win (its `messages` channel keeps the transcript reducer), so a
middleware adds keys and never changes how the transcript is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, get_type_hints

from typing_extensions import TypedDict

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware


def state_with(base: type, middleware: Sequence[AgentMiddleware[Any, Any, Any]]) -> type:
    """`base`, or a `TypedDict` of every middleware's state schema and `base`."""
    from langchain.agents.middleware.types import AgentState

    fields: dict[str, Any] = {}
    for schema in dict.fromkeys(m.state_schema for m in middleware):
        hints = get_type_hints(schema, include_extras=True)
        fields.update({k: v for k, v in hints.items() if k not in AgentState.__annotations__})
    if not fields:
        return base
    fields.update(get_type_hints(base, include_extras=True))  # the loop's own keys win
    merged: type = TypedDict(f"{base.__name__}WithMiddleware", fields, total=False)  # type: ignore[misc]
    return merged
