"""The closed sets of names a caller chooses from, with no imports of their own.

`cyrene --help` lists them; it must not load the loop to do so (nodes.core.env
and nodes.core.config import LangGraph and pydantic).
"""

from __future__ import annotations

from typing import Literal, get_args

Actor = Literal["owner", "group", "stranger", "internal"]
"""Who is on the other side of a session (`SessionEnv.actor`)."""

ACTORS: tuple[str, ...] = get_args(Actor)
