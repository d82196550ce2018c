"""Plain functions over a transcript (a list of langchain messages).

No LangGraph imports: these are the facts every node derives from the
transcript instead of keeping counters that could drift from it — where the
current turn starts, which round it is in, which tool calls are unanswered.
"""

from collections.abc import Sequence, Set
from datetime import datetime
from typing import Any, TypeVar

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    ToolCall,
    ToolMessage,
)

from nodes.kernel.messages import last_human, message_text
from nodes.kernel.replies import is_cut_off, requested_calls

MessageT = TypeVar("MessageT", bound=BaseMessage)
INTERRUPTED_PREFIX = "interrupted"
ANNOTATION_KEY = "cyrene"
"""`response_metadata` key under which the loop annotates messages (mood, guard blocks, images)."""


def annotations_of(message: BaseMessage) -> dict[str, Any]:
    """The loop's annotations on a message ({} when none)."""
    return message.response_metadata.get(ANNOTATION_KEY) or {}


def annotation_metadata(**fields: object) -> dict[str, Any]:
    """The `response_metadata` of a new message annotated with `fields` (built with them at
    once, where `annotated` would copy the message)."""
    return {ANNOTATION_KEY: fields} if fields else {}


def annotated(message: MessageT, **fields: object) -> MessageT:
    """A copy of the message with `fields` merged into its annotations."""
    meta = message.response_metadata
    merged = {**meta, ANNOTATION_KEY: {**annotations_of(message), **fields}}
    return message.model_copy(update={"response_metadata": merged})


def is_hidden(message: BaseMessage) -> bool:
    """Messages a guard blocked stay in the transcript but never reach the model."""
    return bool(annotations_of(message).get("hidden"))


RESTRICTED = "restricted"
"""Annotation of a human message said in a group or stranger session (`nodes.boundary.admission`)."""


def said_in_restricted(message: BaseMessage) -> bool:
    """Words said in a group or stranger session: no memory extraction reads them."""
    return bool(annotations_of(message).get(RESTRICTED))


SAID_AT = "said_at"
"""Annotation of a message the boundary admitted: when it was said (ISO 8601). The loop's
clock stamps it; the application may give it to what it imports (`dated`)."""


def dated(message: MessageT, when: datetime) -> MessageT:
    """`message` said at `when`: how an application dates the history it imports
    (`Trusted`); the boundary keeps the date of a trusted message and stamps the rest."""
    return annotated(message, **{SAID_AT: when.isoformat()})


def said_at(message: BaseMessage) -> datetime | None:
    """When a message was said, if the boundary dated it (None: a reply, a tool result, or
    a message stored before dates were kept)."""
    stamp = annotations_of(message).get(SAID_AT)
    try:
        return datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None


def without_turns(
    messages: Sequence[MessageT],
    opened_by: Set[str],
    *,
    opener: str | None = None,
    answering: bool = True,
) -> list[MessageT]:
    """`messages` minus every turn a human message of `opened_by` opened: that message and
    all after it up to the next human message (replies, tool calls and their results go
    together, so no call loses its result). `opener`: the id of the human message that
    opened the turn `messages` start in, when they start inside one. `answering`: the
    last turn is the one being answered, and stays."""
    if not opened_by:
        return list(messages)
    openings = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    if answering and not openings:  # all of it is the turn being answered
        return list(messages)
    current = openings[-1] if answering else -1
    dropping = opener is not None and opener in opened_by
    kept: list[MessageT] = []
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage):
            dropping = i != current and message.id in opened_by
        if not dropping:
            kept.append(message)
    return kept


def opener_before(messages: Sequence[BaseMessage], start: int) -> str | None:
    """The id of the human message that opened the turn `messages[start]` is in, when that
    is before `start` (None: no human message before it)."""
    earlier = last_human(messages[:start])
    return earlier.id if earlier is not None else None


def turn_start(messages: Sequence[BaseMessage]) -> int:
    """Index of the last human message (the current turn's opening), or 0."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return i
    return 0


def latest_user_text(messages: Sequence[BaseMessage]) -> str:
    """The search query of a transcript: last user text, else last message text, else ''."""
    human = last_human(messages)
    if human is not None:
        return message_text(human)
    return message_text(messages[-1]) if messages else ""


def current_round(messages: Sequence[BaseMessage]) -> int:
    """How many model calls the current turn has made (AI messages since its opening)."""
    start = turn_start(messages)
    return sum(isinstance(m, AIMessage) for m in messages[start:])


def turn_number(messages: Sequence[BaseMessage]) -> int:
    """1-based index of the current turn: the number of human messages so far."""
    return sum(isinstance(m, HumanMessage) for m in messages)


def runnable_calls(message: AIMessage) -> list[ToolCall]:
    """The calls of a reply that may run: none of a reply the provider cut off."""
    return [] if is_cut_off(message) else list(message.tool_calls)


def needs_another_round(messages: Sequence[BaseMessage], max_rounds: int) -> bool:
    """The latest reply asked for calls, yet nothing is left to run (the loop answered them:
    cut off, unparseable): the model gets another round to issue them again, unless this
    round was the last."""
    reply = final_ai_message(messages)
    asked = reply is not None and bool(requested_calls(reply))
    return asked and not pending_tool_calls(messages) and current_round(messages) < max_rounds


def pending_tool_calls(messages: Sequence[BaseMessage]) -> list[ToolCall]:
    """Runnable calls of the last AI message that have no tool result yet, in request order."""
    calls, results = last_batch(messages)
    answered = {r.tool_call_id for r in results}
    return [c for c in calls if c["id"] not in answered]


def last_reply_index(messages: Sequence[BaseMessage]) -> int:
    """Index of the last AI message (`len(messages)` when there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], AIMessage):
            return i
    return len(messages)


def unanswered_start(messages: Sequence[BaseMessage]) -> int:
    """Index just after the companion's last reply (0 when it has not spoken): where the
    messages begin that no reply has seen yet (a merged burst, a group's quiet turns)."""
    last = last_reply_index(messages)
    return 0 if last == len(messages) else last + 1


def open_calls_start(messages: Sequence[BaseMessage]) -> int:
    """Where calls may still be open in a transcript that `close_interrupted_calls` leaves
    as it is: at its last reply, unless a message other than a tool result follows that
    reply (then each of its calls was answered first). A group chat's run of unanswered
    human messages is not scanned back to the last reply on every step."""
    if messages and not isinstance(messages[-1], AIMessage | ToolMessage):
        return len(messages)
    return last_reply_index(messages)


def final_ai_message(messages: Sequence[BaseMessage]) -> AIMessage | None:
    """The last AI message of the current turn, if the turn produced one."""
    for message in reversed(messages[turn_start(messages) :]):
        if isinstance(message, AIMessage):
            return message
    return None


def may_pair_calls(message: BaseMessage) -> bool:
    """Whether a message asks for tool calls or answers one (most of a chat does neither:
    a person's words and plain replies, told apart by their exact type at no `isinstance` cost)."""
    kind = type(message)
    if kind is HumanMessage:
        return False
    if kind is AIMessage:
        return bool(message.tool_calls or message.invalid_tool_calls)  # type: ignore[attr-defined]
    return isinstance(message, ToolMessage | AIMessage)


def close_interrupted_calls(messages: list[BaseMessage]) -> list[BaseMessage]:
    """Answer every tool call that a later human message left dangling.

    A turn killed mid-batch and then superseded by a new user message (instead
    of being resumed) leaves an AI tool call without results; providers reject
    such a transcript. The calls are closed with an error result placed right
    after the batch, so the pairing is valid and the model is told plainly
    that the result was lost. Stand-ins always sit after the batch's real
    results, in call order, and one is dropped again once it answers no call (a
    reply replaced by id without that call), so the result is a function of the
    list alone: idempotent, and the same whether writes were folded one by one or
    at once.
    """
    if not any(map(may_pair_calls, messages)):
        return messages  # no call asked for and no result given: nothing can be open
    out: list[BaseMessage] = []
    open_calls: list[ToolCall | InvalidToolCall] = []
    held: dict[str | None, BaseMessage] = {}
    """Stand-ins met since the reply: put back where its batch closes, in call order."""
    for message in messages:
        if isinstance(message, ToolMessage) and message.id == _interrupted_id(message.tool_call_id):
            held[message.id] = message
            continue
        if isinstance(message, ToolMessage):
            open_calls = [c for c in open_calls if c["id"] != message.tool_call_id]
        elif open_calls or held:
            out.extend(
                held.get(_interrupted_id(c["id"])) or _interrupted_result(c) for c in open_calls
            )
            open_calls, held = [], {}
        if isinstance(message, AIMessage):
            open_calls = [c for c in requested_calls(message) if c.get("id")]
        out.append(message)
    # At the end, a stand-in still answers its open call; one that answers none goes.
    out.extend(held[i] for c in open_calls if (i := _interrupted_id(c["id"])) in held)
    unchanged = len(out) == len(messages) and all(
        a is b for a, b in zip(out, messages, strict=True)
    )
    return messages if unchanged else out


def _interrupted_id(call_id: str | None) -> str:
    return f"{INTERRUPTED_PREFIX}-{call_id}"


def _interrupted_result(call: ToolCall | InvalidToolCall) -> ToolMessage:
    return ToolMessage(
        content=(
            f"{INTERRUPTED_PREFIX}: the session stopped before this call's result was "
            "recorded; it may or may not have run. Do not assume it succeeded."
        ),
        tool_call_id=call["id"],
        name=call["name"],
        status="error",
        id=_interrupted_id(call["id"]),
    )


def last_batch(messages: Sequence[BaseMessage]) -> tuple[list[ToolCall], list[ToolMessage]]:
    """The runnable tool calls of the latest AI message and the results that answered them."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AIMessage):
            results = [m for m in messages[i + 1 :] if isinstance(m, ToolMessage)]
            return runnable_calls(message), results
        if isinstance(message, HumanMessage):
            break
    return [], []
