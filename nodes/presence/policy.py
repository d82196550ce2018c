"""Group-chat presence (`GroupPresence.reply`): answer a group turn when addressed, else listen.

`"mentioned"` answers a turn whose messages name the persona (its name or a
nickname, matched as a mention: `nodes.presence.mentions`) or that the
platform flagged (`SessionEnv(mentioned=True)`, stamped on the messages at the
boundary, so a merged burst keeps each message's flag). `"judged"` asks a
`ReplyJudge` (`ReplyScorer` offline by default, or `LLMReplyJudge`). Display
names are never read for mentions. Owner, stranger and internal sessions
always answer; so does every group turn under `"always"` (no policy then).

The decision comes first, before vision, compaction or any view is built, so
a quiet turn makes no model call of any kind (`graph.builder` starts a group
turn at `call_model` when presence is on):

    quiet   the decision is `call_model`'s whole update (`presence`, with its
            reason) and the turn ends; the message is stored as any other, with
            its speaker; the turn-end hook still runs, extraction never does
    reply   with no stage before the model, the same round goes on to the model;
            otherwise the turn runs its first stage (vision, compaction, the view
            step) and comes back to `call_model`, which then calls the model

Either way the decision is an event on `stream_mode="custom"` (`kind:
"presence"`). The next answered turn's view holds the quiet messages before it,
each with its speaker note, within the compaction budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from nodes.core.policy import Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.messages import message_text
from nodes.kernel.transcript import is_hidden
from nodes.presence.hearing import Hearing, ReplyVerdict
from nodes.presence.judges import ReplyScorer
from nodes.presence.mentions import MentionMatcher
from nodes.presence.settings import GroupPresence, PresenceRecord, PresenceState
from nodes.token_accounting.aside import add_aside, measured
from nodes.token_accounting.state import TokenUsageState

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.presence")

WINDOW = 30
"""How far back a decision looks: the messages it reads, whatever the session's length."""
RECENT = 20
"""The conversation a judge sees (`Hearing.recent`) and the companion's share is taken of."""
OWNER_LABEL = "主人"
NOT_ADDRESSED = "not addressed (no name, nickname or platform mention)"


def spoken(message: BaseMessage) -> bool:
    """A person's message, or a reply of the companion's with text (not a bare tool call)."""
    if isinstance(message, HumanMessage):
        return True
    return isinstance(message, AIMessage) and bool(message_text(message))


def unheard(messages: Sequence[BaseMessage], quiet_on: str | None) -> list[HumanMessage]:
    """The human messages no decision has heard yet, however many: back from the newest to
    the companion's last visible reply, or to `quiet_on` (the newest message the last quiet
    turn heard; a mention at or before it would have been answered). A burst is read as a
    whole, and the walk is as long as the burst, whatever the session's length."""
    new: list[HumanMessage] = []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.id == quiet_on or (isinstance(message, AIMessage) and not is_hidden(message)):
            break
        if isinstance(message, HumanMessage) and not is_hidden(message):
            new.append(message)
    return new[::-1]


def hear(
    messages: Sequence[BaseMessage],
    persona_id: str | None,
    names: tuple[str, ...],
    matcher: MentionMatcher,
    quiet_on: str | None = None,
) -> Hearing:
    """What the group said since the companion last spoke: the conversation around it from
    the last `WINDOW` messages, and mentions looked for in everything no decision has heard
    yet (`unheard`)."""
    tail = [m for m in messages[-WINDOW:] if not is_hidden(m)]
    last_reply = max((i for i, m in enumerate(tail) if isinstance(m, AIMessage)), default=-1)
    waiting = tuple(m for m in tail[last_reply + 1 :] if isinstance(m, HumanMessage))
    new = unheard(messages, quiet_on)
    pending = tuple(new) if len(new) > len(waiting) else waiting  # a burst past the window
    recent = tuple(m for m in tail if spoken(m))[-RECENT:]
    people = [m for m in recent if isinstance(m, HumanMessage)]
    addressed = next((why for m in reversed(new) if (why := matcher.addressed_by(m))), None)
    return Hearing(
        persona_id=persona_id,
        names=names,
        recent=recent,
        pending=pending,
        speakers=tuple(dict.fromkeys(m.name or OWNER_LABEL for m in people)),
        addressed=addressed,
        own_share=(len(recent) - len(people)) / len(recent) if recent else 0.0,
    )


def after_decision(state: Mapping[str, Any]) -> Literal["answer", "quiet"] | None:
    """Where a group turn goes when `call_model` decided and called no model: its stages
    (`"answer"`) or its end (`"quiet"`). None once the model has answered, or with no
    decision for the newest message."""
    record, messages = state.get("presence"), state.get("messages") or []
    if not record or not messages or isinstance(messages[-1], AIMessage):
        return None
    if record["heard"] != messages[-1].id:
        return None
    return "answer" if record["reply"] else "quiet"


def quiet_reason(state: Mapping[str, Any]) -> str | None:
    """Why the session's latest turn stayed quiet; None when it answered (or never decided)."""
    return state["presence"]["reason"] if after_decision(state) == "quiet" else None


class DecidePresence(RoundPolicy):
    """Before the model, on a group turn's first round: reply, or stay quiet (see the module).

    It blocks only through its judge: `"mentioned"` and the offline scorer never do.
    """

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop, stages.before_model)] if loop.feature(GroupPresence).decides else []

    def __init__(self, loop: Loop, stages_before_model: bool) -> None:
        settings = loop.feature(GroupPresence)
        self.loop = loop
        self.mode = settings.reply
        self.judge = (settings.judge or ReplyScorer()) if self.mode == "judged" else None
        self.blocking = self.judge is not None and bool(getattr(self.judge, "blocking", True))
        self.stages = stages_before_model
        self._matchers: dict[str | None, tuple[tuple[str, ...], MentionMatcher]] = {}

    def before_model(self, round: Round) -> None:
        if round.env.actor != "group" or round.number > 1:
            return
        if after_decision(round.state) == "answer":  # decided, then the stages ran: answer now
            return
        names, matcher = self.matcher(round.persona_id)
        last = cast(PresenceState, round.state).get("presence")
        quiet_on = last["heard"] if last and not last["reply"] else None
        hearing = hear(round.messages, round.persona_id, names, matcher, quiet_on)
        verdict, usage = measured(self.verdict, hearing)
        stored = cast(TokenUsageState, round.state).get("token_usage")
        add_aside(round.update, stored, "presence", usage)
        record = PresenceRecord(
            reply=verdict.reply,
            reason=verdict.reason,
            heard=round.messages[-1].id,
            policy=self.mode,
        )
        if round.first_attempt:
            round.emit({"kind": "presence", **record, "session_id": round.session_id})
        if verdict.reply and not self.stages:
            round.update["presence"] = record
        else:
            round.answer(presence=record)

    def matcher(self, persona_id: str | None) -> tuple[tuple[str, ...], MentionMatcher]:
        """The persona's names (its name, else its id; then its nicknames) and their matcher."""
        if persona_id not in self._matchers:
            persona = self.loop.persona(persona_id)
            name = (persona.name if persona else "") or persona_id
            names = tuple(n for n in (name, *(persona.nicknames if persona else ())) if n)
            self._matchers[persona_id] = (names, MentionMatcher(names))
        return self._matchers[persona_id]

    def verdict(self, hearing: Hearing) -> ReplyVerdict:
        if self.judge is None:
            return ReplyVerdict(hearing.addressed is not None, hearing.addressed or NOT_ADDRESSED)
        try:
            return self.judge.judge(hearing)
        except Exception as exc:  # a judge's bug must not silence the companion
            log.exception("the reply judge failed; the turn is answered")
            return ReplyVerdict(True, f"the reply judge failed ({type(exc).__name__}); answering")
