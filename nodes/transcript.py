"""Plain functions over a transcript (a list of langchain messages).

No LangGraph imports: these are the facts every node derives from the
transcript instead of keeping counters that could drift from it — where the
current turn starts, which round it is in, which tool calls are unanswered.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from memory.transcript import last_human, message_text

INTERRUPTED_PREFIX = "interrupted"
ANNOTATION_KEY = "cyrene"
"""`response_metadata` key under which the loop annotates messages (mood, guard blocks, images)."""


def annotations(message: BaseMessage) -> dict:
    """The loop's annotations on a message ({} when none)."""
    return message.response_metadata.get(ANNOTATION_KEY) or {}


def annotated(message: BaseMessage, **fields: object) -> BaseMessage:
    """A copy of the message with `fields` merged into its annotations."""
    meta = message.response_metadata
    merged = {**meta, ANNOTATION_KEY: {**annotations(message), **fields}}
    return message.model_copy(update={"response_metadata": merged})


def turn_start(messages: Sequence[BaseMessage]) -> int:
    """Index of the last human message (the current turn's opening), or 0."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return i
    return 0


def latest_user_text(messages: Sequence[BaseMessage]) -> str:
    """The seed's `queryFromMessages`: last user text, else last message text, else ''."""
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


def pending_tool_calls(messages: Sequence[BaseMessage]) -> list[dict]:
    """Calls of the last AI message that have no tool result yet, in request order."""
    calls, results = last_batch(messages)
    answered = {r.tool_call_id for r in results}
    return [c for c in calls if c["id"] not in answered]


def final_ai_message(messages: Sequence[BaseMessage]) -> AIMessage | None:
    """The last AI message of the current turn, if the turn produced one."""
    for message in reversed(messages[turn_start(messages) :]):
        if isinstance(message, AIMessage):
            return message
    return None


def close_interrupted_calls(messages: list[BaseMessage]) -> list[BaseMessage]:
    """Answer every tool call that a later human message left dangling.

    A turn killed mid-batch and then superseded by a new user message (instead
    of being resumed) leaves an AI tool call without results; providers reject
    such a transcript. The calls are closed with an error result placed right
    after the batch, so the pairing is valid and the model is told plainly
    that the result was lost. Idempotent, and a function of the list alone.
    """
    out: list[BaseMessage] = []
    open_calls: list[dict] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            open_calls = [c for c in open_calls if c["id"] != message.tool_call_id]
        elif open_calls:
            out.extend(_interrupted_result(call) for call in open_calls)
            open_calls = []
        if isinstance(message, AIMessage) and message.tool_calls:
            open_calls = list(message.tool_calls)
        out.append(message)
    return out if len(out) != len(messages) else messages


def _interrupted_result(call: dict) -> ToolMessage:
    return ToolMessage(
        content=(
            f"{INTERRUPTED_PREFIX}: the session stopped before this call's result was "
            "recorded; it may or may not have run. Do not assume it succeeded."
        ),
        tool_call_id=call["id"],
        name=call["name"],
        status="error",
        id=f"{INTERRUPTED_PREFIX}-{call['id']}",
    )


def last_batch(messages: Sequence[BaseMessage]) -> tuple[list[dict], list[ToolMessage]]:
    """The tool calls of the latest AI message and the results that answered them."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AIMessage):
            results = [m for m in messages[i + 1 :] if isinstance(m, ToolMessage)]
            return list(message.tool_calls), results
        if isinstance(message, HumanMessage):
            break
    return [], []
