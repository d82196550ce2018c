"""The reply modes of group presence, with no imports of their own: `cyrene --help` lists
them without loading the loop (`nodes.presence.settings` imports pydantic)."""

from __future__ import annotations

from typing import Literal, get_args

GroupReply = Literal["always", "mentioned", "judged"]
"""Which group turns the companion answers (`GroupPresence.reply`)."""
GROUP_REPLIES: tuple[str, ...] = get_args(GroupReply)
