"""Anthropic prompt-cache breakpoints at the end of the stable part of a request.

Anthropic caches a request prefix only up to a content block marked
`cache_control` (at most four per request), and a later request reuses it
when it repeats that prefix exactly, looking back up to about twenty blocks
from its own breakpoints. Under `ModelView(layout="cache")` the view puts what
stays the same first (`nodes.context.layout`), so for each call to an Anthropic
model this policy marks two blocks:

1. the first block of the leading system message (Anthropic's order is tools,
   system, messages, so this caches the tools with it): every persona's
   instructions and the rules of the notes, the same for the whole session
   (the summary, when there is one, is the next block, and the notes are in the
   conversation: `nodes.context.encoding`). A persona switch or a compaction
   changes what follows it, so their requests still read it;
2. the last block before the round's own blocks: the conversation so far.
   The next request repeats everything up to it and adds the reply, the next
   message and its own round state, so it finds this entry.

The marks go on the request's copies: the transcript is never changed, and a
participant's text block gets the `cache_control` key and nothing else.
Other providers get nothing: OpenAI caches the longest repeated prefix by
itself. A call to a fallback model is marked when that model is Anthropic's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage, SystemMessage

from nodes.context.layout import is_round_state
from nodes.context.settings import ModelView
from nodes.core.policy import CallModel, CallSteps, ModelCall, Round, RoundPolicy
from nodes.core.stages import Stages

if TYPE_CHECKING:
    from nodes.core.loop import Loop

EPHEMERAL = {"type": "ephemeral"}


class PromptCacheBreakpoints(RoundPolicy):
    """Around each call to an Anthropic model: `cache_control` at the end of the leading
    system message's first block and at the end of the conversation, before the round's
    own blocks."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop)] if loop.feature(ModelView).layout == "cache" else []

    blocking = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        if self.loop.family(request.model) == "anthropic":
            request = request.override(view=with_breakpoints(request.view))
        return (yield from call(request))


def with_breakpoints(view: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Copies of `view` with the system message's first block and the last stable message
    marked."""
    marked = list(view)
    lead = 1 if marked and isinstance(marked[0], SystemMessage) else 0
    if lead and markable(marked[0], block=0):
        marked[0] = with_breakpoint(marked[0], block=0)
    stable = range(stable_end(marked, lead) - 1, lead - 1, -1)
    for index in [i for i in stable if markable(marked[i])][:1]:
        marked[index] = with_breakpoint(marked[index])
    return marked


def stable_end(view: Sequence[BaseMessage], lead: int) -> int:
    """Where the round's own blocks begin: the round-state block, or the system messages
    after the conversation (`inline`); `len(view)` when there are none."""
    end = len(view)
    while end > lead and (
        is_round_state(view[end - 1]) or isinstance(view[end - 1], SystemMessage)
    ):
        end -= 1
    return end


def markable(message: BaseMessage, block: int = -1) -> bool:
    """Whether the message's `block` (its last by default) keeps a `cache_control` mark:
    text that is not blank (LangChain's formatter drops blank text), or an image. Not
    `tool_use` (rebuilt from the message's tool calls) nor `thinking` (Anthropic refuses
    the mark)."""
    content = message.content
    last = content if isinstance(content, str) else (content[block] if content else None)
    if isinstance(last, dict) and last.get("type") == "text":
        last = str(last.get("text", ""))
    if isinstance(last, str):
        return bool(last.strip())
    return isinstance(last, dict) and last.get("type") == "image"


def with_breakpoint(message: BaseMessage, block: int = -1) -> BaseMessage:
    """A copy of `message` whose `block` (its last by default) carries `cache_control`."""
    content = message.content
    blocks: list[Any] = [content] if isinstance(content, str) else list(content)
    chosen = blocks[block]
    as_dict = {"type": "text", "text": chosen} if isinstance(chosen, str) else dict(chosen)
    blocks[block] = {**as_dict, "cache_control": dict(EPHEMERAL)}
    return message.model_copy(update={"content": blocks})
