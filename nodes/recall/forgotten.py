"""Leaving forgotten words out of what the model is shown again of older messages.

A forget erases a memory; the transcript keeps the words it came from (nothing the user
said is ever lost). What the view shows again of older messages, the recalled ones
(`nodes.recall.block`) and the lines of the compaction summary, leaves out those that
carry a forgotten memory's words, as the memory store recognises them
(`memory.protocols.RecognisesForgotten`, `memory.lifecycle.forgotten_words`). When the
store fails to say, none of them is shown: a forget's words are never shown for want of
a check. The messages of the live window are the conversation itself, shown as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from memory.protocols import RecognisesForgotten
from nodes.core.state import Summary

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.recall")


def carry_forgotten(
    loop: Loop, texts: Sequence[str], ids: Sequence[str | None] | None = None
) -> list[bool]:
    """For each text (a message with its id, if `ids` are given), whether the loop's memory
    store says it carries a forgotten memory's words or is the message one came from (all of
    them, when the store fails to say; none, for a store that forgets nothing)."""
    store = loop.config.memory
    if not texts or not isinstance(store, RecognisesForgotten):
        return [False] * len(texts)
    try:
        return list(store.carries_forgotten(texts, ids))
    except Exception:
        log.exception("checking older messages for forgotten words failed; none of them shown")
        return [True] * len(texts)


def unforgotten_summary(loop: Loop, summary: Summary | None) -> Summary | None:
    """The summary without its lines that carry a forgotten memory's words (a structural
    summary's line is one older message's)."""
    if not summary:
        return summary
    lines = summary["text"].splitlines()
    forgotten = carry_forgotten(loop, lines)
    if not any(forgotten):
        return summary
    kept = summary.copy()
    kept["text"] = "\n".join(line for line, gone in zip(lines, forgotten, strict=True) if not gone)
    return kept if kept["text"].strip() else None
