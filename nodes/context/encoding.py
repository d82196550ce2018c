"""How the leading blocks and speaker notes reach a given provider.

Two encodings, both keeping every message in its stored order and never
putting attribution into a participant's or the model's text:

- `inline` — the reference rendering: leading system messages, the role
  declaration, and each `[发言归属]` note as its own system message right where
  the speaker changes. For OpenAI-compatible models, which accept system
  messages anywhere.
- `leading` — one leading system message holding the leading blocks, the role
  declaration and every note keyed to the message it starts at
  (`第N条起：[发言归属] …`). For providers that reject or hoist system messages
  after the first (Anthropic accepts them only right after a user turn, Gemini
  hoists them, many local chat templates refuse them). System text a trusted
  caller stored in the transcript (`nodes.boundary.admission.Trusted`) goes into the same
  leading message, keyed the same way (`第N条前：…`).

The round's own blocks (who answers, time, working memory, memories) come after the
conversation under `ModelView(layout="cache")` (`nodes.context.layout`): as system
messages with `inline`, as the loop's delimited round-state block with
`leading`, announced in the leading system message. There, with `leading`, the
notes are blocks of their own in the conversation (`loop_note`) rather than an
index in the leading message, which would change with every change of speaker
and so every cached prefix; the round-state block lists where they are.

Names inside notes are already quoted by `nodes.context.attribution`, so no note can
span lines: each index entry stays one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from langchain_core.messages import BaseMessage, SystemMessage

from nodes.context.attribution import Attribution
from nodes.context.layout import ROUND_STATE_NOTE, loop_note, round_state_message
from nodes.kernel.messages import message_text
from nodes.kernel.providers import Provider

Encoding = Literal["inline", "leading"]
ENCODING_BY_PROVIDER: dict[Provider, Encoding] = {
    "openai": "inline",
    "anthropic": "leading",
    "google": "leading",
    "ollama": "leading",
    "other": "inline",
}
NOTE_INDEX_HEADER = "发言归属索引（按对话中的消息序号，序号从 1 起）："
NOTE_POSITIONS_HEADER = "「发言归属」标注在这些消息之前："
"""Short: it is sent uncached every round; the leading message explains it (`ROUND_STATE_NOTE`)."""
SYSTEM_INDEX_HEADER = "对话中的系统消息（按对话中的消息序号，序号从 1 起）："
INDEX_LOOKALIKE = re.compile(r"^(?=第\d+条[前起]：|发言归属索引|对话中的系统消息)", re.MULTILINE)
"""A line of other text that would read as one of the leading message's index lines."""
# OpenAI's `name` field accepts only these; a nickname like 小明 is rejected
# with a 400. The notes already carry attribution, so such names are omitted
# from the request copy (the stored message keeps its name).
_OPENAI_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def without_unsafe_names(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Request copies of the messages, minus `name`s the OpenAI API would reject."""
    return [
        m.model_copy(update={"name": None}) if m.name and not _OPENAI_SAFE_NAME.match(m.name) else m
        for m in messages
    ]


def encode_for_provider(
    encoding: Encoding,
    leading: Sequence[BaseMessage],
    attribution: Attribution,
    *,
    trailing: Sequence[str] = (),
    notes_inline: bool = False,
    after_lead: Sequence[BaseMessage] = (),
) -> list[BaseMessage]:
    """Join leading blocks, `after_lead`, the attributed conversation and the `trailing`
    blocks in the given encoding (`leading` with `notes_inline`: each note a block of its
    own where the speaker changes, and the round-state block lists where they are, so the
    leading message stays the same as a group grows and the notes are part of the cached
    conversation; what follows the lead, `after_lead` and the indexes, is a second text
    block of the leading message, so the first block stays the same when it changes)."""
    if encoding == "inline":
        declaration = [SystemMessage(attribution.declaration)] if attribution.declaration else []
        after = [SystemMessage(text) for text in trailing]
        return [*leading, *declaration, *after_lead, *attribution.conversation, *after]
    texts = [str(m.content) for m in leading]
    if attribution.declaration:
        texts.append(attribution.declaration)
    conversation: list[BaseMessage] = []
    numbered = 0  # the conversation's messages so far, the loop's notes not counted
    index_lines: list[str] = []
    note_numbers: list[int] = []
    system_lines: list[str] = []
    for position, message in enumerate(attribution.conversation):
        if position in attribution.notes and notes_inline:
            note_numbers.append(numbered + 1)
            conversation.append(loop_note(attribution.notes[position]))
        elif position in attribution.notes:
            index_lines.append(f"第{numbered + 1}条起：{attribution.notes[position]}")
        elif isinstance(message, SystemMessage):
            system_lines.append(f"第{numbered + 1}条前：{message_text(message)}")
        else:
            numbered += 1
            conversation.append(message)
    round_state = list(trailing)
    if note_numbers:
        round_state.append(NOTE_POSITIONS_HEADER + "第" + "、".join(runs(note_numbers)) + "条")
    if round_state:
        texts.append(ROUND_STATE_NOTE)
    later = [str(m.content) for m in after_lead]
    if index_lines:
        later.append(NOTE_INDEX_HEADER + "\n" + "\n".join(index_lines))
    if system_lines:
        later.append(SYSTEM_INDEX_HEADER + "\n" + "\n".join(system_lines))
    tail = [round_state_message(round_state)] if round_state else []
    return [*leading_message(texts, later, apart=notes_inline), *conversation, *tail]


def runs(numbers: Sequence[int]) -> list[str]:
    """Ascending numbers as runs, `[1, 2, 3, 5]` → `["1至3", "5"]`: in a group nearly every
    message has a note, and the list is sent uncached every round."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return [f"{a}至{b}" if b > a else str(a) for a, b in spans]


def leading_message(texts: list[str], later: list[str], *, apart: bool) -> list[BaseMessage]:
    """The one leading system message: `texts` then `later`, joined, or (`apart`) as two
    text blocks, so a change in `later` leaves the first block as it was."""
    if apart and texts and later:
        blocks = ["\n\n".join(texts), "\n\n".join(later)]
        return [SystemMessage([{"type": "text", "text": text} for text in blocks])]
    joined = "\n\n".join(texts + later)
    return [SystemMessage(joined)] if joined else []
