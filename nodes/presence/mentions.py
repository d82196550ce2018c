"""Whether a message's text mentions the companion: its name or a nickname, as a mention.

Only a message's own text counts here (the platform's own flag is stamped on the
message at the boundary, `MENTIONED`); display names never do, neither the
speaker's nor anyone else's in the room: a member who calls themselves 昔涟
addresses nobody by speaking, and a member called `@昔涟` or 小昔昔 changes
nothing about whether another member's "@昔涟 在吗" addresses her.

Text and names are compared NFKC-normalised and casefolded (`＠ＣＹＲＥＮＥ` is
`@cyrene`), with format characters (zero-width spaces and joiners, bidi marks)
taken out, since they show nothing. A name is a mention where it stands as a
word of its own:

- A name that starts or ends with a letter or digit of a script written with
  spaces (Latin, Cyrillic, Greek, Hangul…) must not run on into a word there:
  `Cyrene` is mentioned in "hi Cyrene!", "@cyrene" and "问Cyrene吧", not in
  "Cyrenes", "cyrene_bot", "cyrene\u200b_bot" or "cyrene\u0332s" (a combining
  mark belongs to the letter it follows).
- Scripts written without spaces (Chinese, Japanese, Thai…) have no word edge
  to look for, so a name there is a mention wherever it stands ("昔涟你觉得呢",
  "问问昔涟", "@昔涟", "小昔昔你好"). A one-character name, or one that is also
  a common word, is matched inside words it happens to start or end (往昔涟漪
  holds 昔涟): give such a persona a nickname people write with an @.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from langchain_core.messages import BaseMessage

from nodes.kernel.messages import message_text
from nodes.kernel.transcript import annotations_of

MENTIONED = "mentioned"
"""The annotation the boundary stamps on a message the platform flagged as a mention
(`SessionEnv(mentioned=True)`); the caller cannot set it in the message itself."""

_UNSPACED = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)


def fold(text: str) -> str:
    """Text as names are compared: NFKC (full-width letters and ＠ become plain), casefolded,
    without format characters (a zero-width space shows nothing, so it joins no word)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")


def unspaced(ch: str) -> bool:
    """A character of a script written without spaces between words."""
    code = ord(ch)
    return any(low <= code <= high for low, high in _UNSPACED)


def word_char(ch: str) -> bool:
    """A letter, digit, underscore or combining mark (part of the letter before it) of a
    script whose words are separated by spaces."""
    joins = ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")
    return joins and not unspaced(ch)


def free_edges(text: str, start: int, end: int) -> bool:
    """`text[start:end]` does not run on into a word of a spaced script at either end."""
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    name = text[start:end]
    runs_left = word_char(name[0]) and bool(before) and word_char(before)
    runs_right = word_char(name[-1]) and bool(after) and word_char(after)
    return not (runs_left or runs_right)


class MentionMatcher:
    """Finds the companion's names in text, as mentions (see the module docstring).

    Args:
        names: the persona's name (or id, when it has none) and nicknames.
    """

    def __init__(self, names: Iterable[str]) -> None:
        folded = {fold(name).strip(): name for name in names if name and name.strip()}
        # Longest first: "小昔昔" is tried before "小昔".
        self.names = sorted(folded.items(), key=lambda item: -len(item[0]))

    def mentioned(self, text: str) -> str | None:
        """The first name `text` mentions (as the persona spells it), or None."""
        folded = fold(text)
        for name, spelled in self.names:
            at = folded.find(name)
            while at != -1:
                if free_edges(folded, at, at + len(name)):
                    return spelled
                at = folded.find(name, at + 1)
        return None

    def addressed_by(self, message: BaseMessage) -> str | None:
        """Why `message` addresses the companion (the platform's flag, or a name in its
        text), or None. No display name is read."""
        if annotations_of(message).get(MENTIONED):
            return "the platform flagged a mention"
        name = self.mentioned(message_text(message))
        return f"mentioned {name}" if name else None
