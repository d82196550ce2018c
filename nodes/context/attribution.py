"""Speaker attribution: who said what, in exact wire strings.

Three structural facts decide attribution, all from message metadata, never
from text:
- an assistant message's `name` is the persona lane (the persona id that said it);
- a user message's `name` is the third-party lane (a group member's display
  name; the owner is never labelled);
- in restricted (group/stranger) sessions an unlabelled user message is the
  owner and an unlabelled assistant message is the current persona. Elsewhere
  an empty label means "unlabelled" and gets no note.

Rendering only adds system messages: it never edits, reorders or drops a
message, and when no message carries an explicit label it renders nothing.
Names inside a note are quoted with `nodes.kernel.sanitize.quoted`, so a display name
can neither close its 「…」 nor start a line of system text of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from nodes.kernel.sanitize import quoted, single_line

ROLE_CONTEXT_MARKER = "[会话角色] "
SPEAKER_SWITCH_MARKER = "[发言归属] "
UNRESTRICTED_TAIL = (
    "本会话此前由不同角色相继发言：下面凡是标了「发言归属」的发言，都只属于标注的那个角色——"
    "不要把别个角色说过的话当成你自己说过的，也不要继承他们的身份、口吻或立场；"
    "该标注从其出现处起生效，直到下一条「发言归属」为止。"
)
RESTRICTED_TAIL = (
    "本会话的发言按下面的「发言归属」标注分属不同发言者：标了昵称的来自第三方人员（非管理员账户），"
    "标了主人的来自主人本人——不要把第三方的话当成主人说的，也不要把别人的话当成你自己说过的、"
    "不要继承他们的身份或口吻；该标注从其出现处起生效，直到下一条「发言归属」为止。"
)
STABLE_SELF = (
    "你当前以哪个角色的身份对话，由每轮附加的「会话角色」说明：标注来自那个角色的发言是你自己说的，"
    "标注来自别的角色的都不是你说的。"
)
"""With `stable_notes`: how the notes that name a persona relate to the one answering."""
OWNER_NOTE_BODY = "以下发言来自主人（管理员账户）本人，不是你说的，也不是本会话里的第三方人员。"

# Key prefixes keep a persona id and a nickname that happen to be equal apart.
_PERSONA_KEY = "role\x00"
_THIRD_PARTY_KEY = "third\x00"
_OWNER_KEY = "owner"

SpeakerKind = Literal["persona", "third_party", "owner"]
NameLookup = Callable[[str], str]


@dataclass(frozen=True)
class Speaker:
    key: str
    kind: SpeakerKind
    name: str = ""


@lru_cache(maxsize=1024)
def _persona(name: str) -> Speaker:
    """A persona as a speaker, made once: a view asks for one per message, every round."""
    return Speaker(_PERSONA_KEY + name, "persona", name)


@lru_cache(maxsize=1024)
def _third_party(name: str) -> Speaker:
    return Speaker(_THIRD_PARTY_KEY + name, "third_party", name)


_OWNER = Speaker(_OWNER_KEY, "owner")


def explicit_speaker(message: BaseMessage) -> Speaker | None:
    """The speaker a message carries itself: persona label or third-party nickname."""
    name = (getattr(message, "name", None) or "").strip()
    if not name:
        return None
    if isinstance(message, AIMessage):
        return _persona(name)
    if isinstance(message, HumanMessage):
        return _third_party(name)
    return None


def speaker_of(message: BaseMessage, *, restricted: bool, current: str | None) -> Speaker | None:
    """Explicit label first; in restricted sessions empty labels mean owner / self."""
    if speaker := explicit_speaker(message):
        return speaker
    if not restricted:
        return None
    if isinstance(message, HumanMessage):
        return _OWNER
    if isinstance(message, AIMessage) and current:
        return _persona(current)
    return None


def any_speaker_label(messages: Sequence[BaseMessage]) -> bool:
    return any(explicit_speaker(m) is not None for m in messages)


def speaker_label(persona_id: str, display_name: NameLookup) -> str:
    """`「name」（id）`, or `「id」` when the name is unknown, blank or equal to the id."""
    name = (display_name(persona_id) or "").strip()
    if not name or name == persona_id:
        return quoted(persona_id)
    return f"{quoted(name)}（{single_line(persona_id)}）"


def role_declaration(*, restricted: bool, current: str | None, display_name: NameLookup) -> str:
    """The leading `[会话角色]` text declaring who answers and how notes work."""
    persona_part = f"你正以{speaker_label(current, display_name)}的身份对话。" if current else ""
    return ROLE_CONTEXT_MARKER + persona_part + note_rules(restricted)


def note_rules(restricted: bool) -> str:
    """How the notes work: the part of the declaration that does not name who answers."""
    return RESTRICTED_TAIL if restricted else UNRESTRICTED_TAIL


def speaking_as(current: str, display_name: NameLookup) -> str:
    """Who answers this round, for notes that do not say it (`stable_notes`)."""
    return f"{ROLE_CONTEXT_MARKER}你正以{speaker_label(current, display_name)}的身份对话。"


def speaker_note(
    speaker: Speaker, *, current: str | None, display_name: NameLookup, stable: bool = False
) -> str:
    """The `[发言归属]` note announcing a speaker until the next note (`stable`: a persona's
    names it and does not say whether it is the one answering now, which `speaking_as` says)."""
    if speaker.kind == "owner":
        return SPEAKER_SWITCH_MARKER + OWNER_NOTE_BODY
    if speaker.kind == "third_party":
        return (
            f"{SPEAKER_SWITCH_MARKER}以下发言来自{quoted(speaker.name)}——本会话里的第三方人员"
            "（非管理员账户），不是主人，也不是你说的。"
        )
    label = speaker_label(speaker.name, display_name)
    if stable:
        return f"{SPEAKER_SWITCH_MARKER}以下发言来自{label}。"
    if speaker.name and speaker.name == current:
        return f"{SPEAKER_SWITCH_MARKER}以下发言来自你自己——{label}。"
    return f"{SPEAKER_SWITCH_MARKER}以下发言来自{label}，不是你说的。"


@dataclass(frozen=True)
class Attribution:
    """A rendered conversation: the declaration (or None) and the messages with notes."""

    declaration: str | None
    conversation: list[BaseMessage]
    notes: dict[int, str]
    """Index in `conversation` of each inserted note → its text (for other encodings)."""
    speaking: str = ""
    """With `stable_notes`: who answers this round (`speaking_as`), which the declaration
    and the notes then leave out."""


def attribute_conversation(
    messages: Sequence[BaseMessage],
    *,
    restricted: bool,
    current: str | None,
    display_name: NameLookup,
    stable_notes: bool = False,
) -> Attribution:
    """Insert a note wherever the attributed speaker changes.

    `stable_notes` (`ModelView(layout="cache")`): the declaration and the notes read the
    same whichever persona answers, so a persona switch leaves the cached prefix as it was;
    they are there from the first message on, and `Attribution.speaking` says who answers.
    """
    if not stable_notes and not any_speaker_label(messages):
        return Attribution(None, list(messages), {})
    out: list[BaseMessage] = []
    notes: dict[int, str] = {}
    previous = ""
    for message in messages:
        speaker = speaker_of(message, restricted=restricted, current=current)
        if speaker is not None and speaker.key != previous:
            text = speaker_note(
                speaker, current=current, display_name=display_name, stable=stable_notes
            )
            notes[len(out)] = text
            out.append(SystemMessage(text))
            previous = speaker.key
        out.append(message)
    if stable_notes:
        speaking = speaking_as(current, display_name) if current else ""
        rules = ROLE_CONTEXT_MARKER + STABLE_SELF + note_rules(restricted)
        return Attribution(rules, out, notes, speaking)
    declaration = role_declaration(
        restricted=restricted, current=current, display_name=display_name
    )
    return Attribution(declaration, out, notes)


def describe_speaker(
    message: BaseMessage, *, restricted: bool, current: str | None, display_name: NameLookup
) -> str:
    """A short who-said-it label for summaries (used by compaction), e.g. `「昔涟」（xilian）`."""
    speaker = speaker_of(message, restricted=restricted, current=current)
    if speaker is None:
        return {"human": "用户", "ai": "助手", "tool": "工具"}.get(message.type, message.type)
    if speaker.kind == "owner":
        return "主人"
    if speaker.kind == "third_party":
        return quoted(speaker.name)
    return speaker_label(speaker.name, display_name)
