"""Text hygiene shared by every layer: surrogates, visible text, one line, data in system text.

- **Lone surrogates** (code points U+D800–U+DFFF that are not half of a pair)
  cannot be encoded as UTF-8: databases store them as `?` or refuse them, and
  provider SDKs fail to serialise them. They become U+FFFD; a well-formed
  pair becomes the character it encodes.
- **Visible text**: control and format characters (zero-width spaces and
  joiners, bidi overrides) and line separators show nothing, so text made
  only of them, or of whitespace, is blank.
- **Data inside the loop's system text** (a memory's content and kind, the
  caller's working memory) stays one line and cannot bracket itself like the
  loop's markers (`[发言归属]`, `[kind]`) or close a `「…」` quote: brackets
  become their full-width twins (`as_data`). Text that keeps its lines (a
  compaction summary) has its brackets turned the same way (`marker_proof`).
"""

from __future__ import annotations

import re
import unicodedata

_SURROGATE = re.compile("[\ud800-\udfff]")
# Control, format (zero-width, bidi overrides) and line/paragraph separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})
_BRACKETS = {"[": "［", "]": "］", "【": "［", "】": "］"}
_MARKER_PROOF = str.maketrans(_BRACKETS)
_AS_DATA = str.maketrans({**_BRACKETS, "「": "『", "」": "』", "｢": "『", "｣": "』"})


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD (and surrogate pairs joined)."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def single_line(text: str) -> str:
    """Visible text on one line: whitespace runs become one space, invisible characters go."""
    kept = (
        " " if ch.isspace() else ch
        for ch in clean_text(text)
        if ch.isspace() or unicodedata.category(ch) not in _INVISIBLE
    )
    return " ".join("".join(kept).split())


def is_blank(text: str) -> bool:
    """Nothing visible: empty, whitespace, or only invisible characters."""
    return not single_line(text)


def as_data(text: str) -> str:
    """`text` as one line of data inside system text: it can start no line, open or close
    no `[marker]`, and close no `「quote」`."""
    return single_line(text).translate(_AS_DATA)


def marker_proof(text: str) -> str:
    """`text`, lines kept, with no bracket that could open or close a `[marker]` of the
    loop's (a summary's lines quote participants, and the lines are the summary's form)."""
    return clean_text(text).translate(_MARKER_PROOF)
