"""Text for a terminal: what a message holds is shown, never obeyed.

Messages come from strangers in group chats. An escape sequence in one could
recolour or clear the terminal, move the cursor or set the window title; a
bidi override could make a line read differently from what it holds. So every
control character (C0 but newline and tab, DEL, C1), the bidi controls, the
Unicode line separators and lone surrogates are shown escaped (`\\x1b`,
`\\u202e`) in everything the CLI prints from a message.
"""

from __future__ import annotations

import sys

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_HIDDEN = (
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),
    *_BIDI,
    0x2028,
    0x2029,
    *range(0xD800, 0xE000),
)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ESCAPES = {code: _escape(code) for code in _HIDDEN if chr(code) not in "\n\t"}


def visible(text: str) -> str:
    """`text` with every character that could act on the terminal shown escaped.

    Newlines and tabs stay (a reply may have paragraphs)."""
    return text.translate(_ESCAPES)


def progress_bar(label: str, done: int, total: int) -> None:
    """A progress line on stderr, redrawn in place; the line ends when `done` reaches `total`."""
    bar = "#" * (30 * done // max(total, 1))
    end = "\n" if done >= total else ""
    print(f"\r{label}[{bar:<30}] {done}/{total}", end=end, file=sys.stderr, flush=True)


class Reembedding:
    """Shows re-embedding progress (a store written with another embedding, `memory.storage.reembed`)
    and counts the memories re-embedded."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    def __call__(self, collection: str, done: int, total: int) -> None:
        self.done[collection] = done
        progress_bar(f"re-embedding memory {visible(collection)} ", done, total)
