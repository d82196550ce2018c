"""A session state with the keys of other state schemas (a feature's, a middleware's).

As `create_agent` does for its middleware, the schemas are merged into one
`TypedDict`; the loop's own keys win (its `messages` channel keeps the
transcript reducer), so a schema adds keys and never changes how the transcript
is kept. LangChain's own `AgentState` keys (`jump_to`, `structured_response`)
are left out: the loop keeps neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_type_hints

from typing_extensions import TypedDict


def state_with(base: type, schemas: Iterable[type]) -> type:
    """`base`, or a `TypedDict` of every schema's keys and `base`'s."""
    from langchain.agents.middleware.types import AgentState

    own = get_type_hints(base, include_extras=True)
    fields: dict[str, Any] = {}
    for schema in dict.fromkeys(schemas):
        hints = get_type_hints(schema, include_extras=True)
        fields.update({k: v for k, v in hints.items() if k not in AgentState.__annotations__})
    if not fields.keys() - own.keys():
        return base
    fields.update(own)  # the loop's own keys win
    merged: type = TypedDict(f"{base.__name__}WithFeatures", fields, total=False)  # type: ignore[misc]
    return merged
