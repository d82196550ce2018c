"""Text hygiene at the boundary: one policy for surrogates, ids and display names.

- **Lone surrogates** in every piece of text a run brings in (message text,
  names, working memory) become U+FFFD (`nodes.kernel.text.clean_text`, the one
  policy every layer uses).
- **Ids** (thread, session, turn, message) are keys, not text to repair: one
  with a NUL or a lone surrogate is refused.
- **Display names** come from strangers. They are normalised once (whitespace
  collapsed, control and format characters dropped, length capped) and, in
  notes, quoted so that they can neither close the quote nor start a line.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from nodes.kernel.text import as_data, single_line

MAX_NAME_CHARS = 32
UNNAMED_MEMBER = "未命名成员"
"""The label of a third party whose display name is empty once normalised (never the owner)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_id(what: str, value: Any) -> None:
    """Refuse an id that no database stores faithfully: not text, a NUL, a lone surrogate.

    Ints and UUIDs are accepted as they are (savers key on their `str`).
    """
    if isinstance(value, (int, UUID)) and not isinstance(value, bool):
        return
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} {value!r} contains a NUL character")
    if _SURROGATE.search(value):
        raise ValueError(f"{what} {value!r} is not valid UTF-8 (it holds a lone surrogate)")


def display_name(raw: str) -> str:
    """A display name as the loop keeps it: one visible line of at most `MAX_NAME_CHARS`.

    Idempotent; '' when nothing visible is left.
    """
    return single_line(raw)[:MAX_NAME_CHARS].rstrip()


def quoted(name: str) -> str:
    """`「name」` that stays one quote on one line whatever `name` holds, and can imitate
    none of the loop's `[markers]` inside it either.

    Ordinary names are unchanged (the wire strings); corner brackets inside become
    white ones, square brackets full-width ones, line breaks spaces (`as_data`).
    """
    return "「" + as_data(name) + "」"
