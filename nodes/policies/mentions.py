"""Whether a message's text mentions the companion: its name or a nickname, as a mention.

Only text counts here (the platform's own flag is stamped on the message at the
boundary, `MENTIONED`); a display name never does, so a member who calls
themselves 昔涟 addresses nobody by speaking.

Text and names are compared NFKC-normalised and casefolded (`＠ＣＹＲＥＮＥ` is
`@cyrene`). A name is a mention where it stands as a word of its own:

- A name that starts or ends with a letter or digit of a script written with
  spaces (Latin, Cyrillic, Greek, Hangul…) must not run on into a word there:
  `Cyrene` is mentioned in "hi Cyrene!", "@cyrene" and "问Cyrene吧", not in
  "Cyrenes" or "cyrene_bot".
- Scripts written without spaces (Chinese, Japanese, Thai…) have no word edge
  to look for, so a name there is a mention wherever it stands ("昔涟你觉得呢",
  "问问昔涟", "@昔涟") — except inside a longer name heard in the room: with a
  member called 小昔昔 in the chat, "小昔昔你好" is not the nickname 小昔. A
  one-character name, or one that is also a common word, is matched inside
  words it happens to start or end (往昔涟漪 holds 昔涟): give such a persona
  a nickname people write with an @.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

from langchain_core.messages import BaseMessage

from memory.transcript import message_text
from nodes.view.transcript import annotations_of

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
    """Text as names are compared: NFKC (full-width letters and ＠ become plain), casefolded."""
    return unicodedata.normalize("NFKC", text).casefold()


def unspaced(ch: str) -> bool:
    """A character of a script written without spaces between words."""
    code = ord(ch)
    return any(low <= code <= high for low, high in _UNSPACED)


def word_char(ch: str) -> bool:
    """A letter, digit or underscore of a script whose words are separated by spaces."""
    return (ch.isalnum() or ch == "_") and not unspaced(ch)


def free_edges(text: str, start: int, end: int) -> bool:
    """`text[start:end]` does not run on into a word of a spaced script at either end."""
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    name = text[start:end]
    runs_left = word_char(name[0]) and bool(before) and word_char(before)
    runs_right = word_char(name[-1]) and bool(after) and word_char(after)
    return not (runs_left or runs_right)


def inside_longer(text: str, start: int, end: int, longer: Iterable[str]) -> bool:
    """`text[start:end]` is part of an occurrence of one of the `longer` names."""
    for name in longer:
        at = text.find(name, max(0, end - len(name)))
        while at != -1 and at <= start:
            if at + len(name) >= end:
                return True
            at = text.find(name, at + 1)
    return False


class MentionMatcher:
    """Finds the companion's names in text, as mentions (see the module docstring).

    Args:
        names: the persona's name (or id, when it has none) and nicknames.
    """

    def __init__(self, names: Iterable[str]) -> None:
        folded = {fold(name).strip(): name for name in names if name and name.strip()}
        # Longest first: "小昔昔" is tried before "小昔".
        self.names = sorted(folded.items(), key=lambda item: -len(item[0]))

    def mentioned(self, text: str, room: Sequence[str] = ()) -> str | None:
        """The first name `text` mentions (as the persona spells it), or None.

        Args:
            text: the message's text.
            room: names heard in the chat (display names): a persona name inside a
                longer one of them is that person's, not a mention.
        """
        folded, heard = fold(text), [fold(name) for name in room]
        for name, spelled in self.names:
            at = folded.find(name)
            if at == -1:
                continue
            longer = [n for n in heard if len(n) > len(name) and name in n]
            while at != -1:
                end = at + len(name)
                if free_edges(folded, at, end) and not inside_longer(folded, at, end, longer):
                    return spelled
                at = folded.find(name, at + 1)
        return None

    def addressed_by(self, message: BaseMessage, room: Sequence[str] = ()) -> str | None:
        """Why `message` addresses the companion (the platform's flag, or a name in its
        text), or None. Its display name is never read."""
        if annotations_of(message).get(MENTIONED):
            return "the platform flagged a mention"
        name = self.mentioned(message_text(message), room)
        return f"mentioned {name}" if name else None
