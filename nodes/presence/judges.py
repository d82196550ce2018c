"""The loop's own `ReplyJudge`s: an offline scorer (the default) and a model with structured output.

`ReplyScorer` follows the shape of the group-chat companions people use
(MaiBot's "reply necessity", SillyTavern's "a mention always activates"): a
mention always replies; otherwise three signals add up to a score, and the
companion speaks when it reaches the threshold:

| signal | weight (default) | why |
|---|---|---|
| the newest message asks the room a question (`?`, `？`, a final 吗/呢/么, an English question word first; not when it names another member) | `+0.35` | a question nobody was asked by name is one the companion may take |
| messages waiting since the companion last spoke | `+0.06` each, at most 6 (`+0.36`) | a lively room it has said nothing in for a while |
| its own share of the last 20 messages above a fair one (1 / (speakers + 1)) | `−2 ×` the excess | it should not take over the room |
| threshold | `0.5` | a question after about three messages, never chatter alone |

`LLMReplyJudge` asks a chat model for `{reply, reason}` before the main model
runs; a mention still replies without asking, and a failing call falls back
to the scorer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from nodes.kernel.messages import message_text
from nodes.presence.hearing import Hearing, ReplyJudge, ReplyVerdict
from nodes.presence.mentions import MentionMatcher, fold

log = logging.getLogger("cyrene.presence")

_ASKING_ENDS = ("?", "？", "吗", "呢", "么", "嘛")
_ASKING_STARTS = ("anyone", "anybody", "does anyone", "who ", "what ", "how ", "why ", "where ")
_TRAILING = " \t!！。.~～…"


def asks_the_room(text: str, others: MentionMatcher) -> bool:
    """A question, and not one put to another member by name."""
    folded = fold(text).strip().rstrip(_TRAILING)
    asking = folded.endswith(_ASKING_ENDS) or folded.startswith(_ASKING_STARTS)
    return asking and others.mentioned(text) is None


@dataclass(frozen=True)
class ReplyScorer:
    """The offline judge: a mention always replies; otherwise a weighted score (see the
    module docstring for what each weight means and why).

    Example:
        >>> GroupPresence(reply="judged", judge=ReplyScorer(threshold=0.6))
    """

    question: float = 0.35
    pending_step: float = 0.06
    pending_cap: int = 6
    share_weight: float = 2.0
    threshold: float = 0.5
    blocking: ClassVar[bool] = False

    def judge(self, hearing: Hearing) -> ReplyVerdict:
        if hearing.addressed:
            return ReplyVerdict(True, hearing.addressed)
        score, parts = self.score(hearing)
        verdict = "≥" if score >= self.threshold else "<"
        reason = f"score {score:.2f} {verdict} {self.threshold:g} ({', '.join(parts)})"
        return ReplyVerdict(score >= self.threshold, reason)

    def score(self, hearing: Hearing) -> tuple[float, list[str]]:
        """The score and a readable term for each signal."""
        newest = message_text(hearing.pending[-1]) if hearing.pending else ""
        asked = self.question if asks_the_room(newest, MentionMatcher(hearing.speakers)) else 0.0
        waiting = len(hearing.pending)
        pressure = self.pending_step * min(waiting, self.pending_cap)
        fair = 1 / (len(hearing.speakers) + 1)
        crowding = self.share_weight * max(0.0, hearing.own_share - fair)
        parts = [
            f"question to the room +{asked:.2f}",
            f"{waiting} waiting +{pressure:.2f}",
            f"own share {hearing.own_share:.0%} −{crowding:.2f}",
        ]
        return asked + pressure - crowding, parts


class Decision(BaseModel):
    """What `LLMReplyJudge` asks the model for."""

    reply: bool = Field(description="true: answer the group now; false: stay quiet and listen")
    reason: str = Field(description="one short sentence saying why")


JUDGE_INSTRUCTIONS = (
    "你在判断群聊里的陪伴者「{name}」现在要不要开口。她不是每句都回：有人叫她、"
    "向大家提了她能答的问题、或者大家冷落了她很久时才说话；别人之间的闲聊、"
    "问别人的问题、她刚说过很多话时就安静听着。只根据下面的聊天记录判断。"
)


class LLMReplyJudge:
    """A chat model decides (structured output `{reply, reason}`), before the main model runs.

    A turn that mentions the companion replies without asking the model. If the
    call fails, the `fallback` judge (the offline scorer) decides, and the reason says so.

    Args:
        model: any chat model that supports `with_structured_output`.
        fallback: the judge when the model fails (default `ReplyScorer()`).
        instructions: the system prompt; `{name}` becomes the persona's name.
    """

    blocking = True

    def __init__(
        self,
        model: BaseChatModel,
        *,
        fallback: ReplyJudge | None = None,
        instructions: str = JUDGE_INSTRUCTIONS,
    ) -> None:
        self.model = model
        self.decide = model.with_structured_output(Decision)
        self.fallback = fallback or ReplyScorer()
        self.instructions = instructions

    def judge(self, hearing: Hearing) -> ReplyVerdict:
        if hearing.addressed:
            return ReplyVerdict(True, hearing.addressed)
        try:
            decision: Any = self.decide.invoke(self.request(hearing))
            if not isinstance(decision, Decision):
                decision = Decision.model_validate(decision)
        except Exception as exc:
            log.exception("the reply judge failed; its fallback decides")
            verdict = self.fallback.judge(hearing)
            return ReplyVerdict(
                verdict.reply, f"judge failed ({type(exc).__name__}); {verdict.reason}"
            )
        return ReplyVerdict(decision.reply, f"judge: {decision.reason}")

    def request(self, hearing: Hearing) -> list[BaseMessage]:
        """The judge's view: its instructions, then the recent chat as `speaker：text` lines."""
        name = hearing.names[0] if hearing.names else "助手"
        lines = [f"{_speaker(m, name)}：{message_text(m)}" for m in hearing.recent]
        return [
            SystemMessage(self.instructions.format(name=name)),
            HumanMessage("\n".join(lines) or "（还没有人说话）"),
        ]


def _speaker(message: BaseMessage, persona: str) -> str:
    if isinstance(message, AIMessage):
        return f"{persona}（她自己）"
    return message.name or "主人"
