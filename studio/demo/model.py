"""The offline demo model — a deterministic stand-in, labelled as a demo everywhere.

It lets every path of the graph run with no network and no API key: it
answers in the current persona's voice (read from the role declaration or the
persona prompt it is sent), answers "who said …" from the attribution notes,
calls a tool when the user plainly asks for one, confirms "记住 …" requests,
and otherwise shows it remembers the previous turn. It is not a language model.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from nodes.context.attribution import ROLE_CONTEXT_MARKER, SPEAKER_SWITCH_MARKER
from nodes.context.summary import SUMMARY_PREFIX
from nodes.kernel.messages import message_text
from studio.demo.offline_model import OfflineChatModel, as_chunk, bound_tool_names

DEMO_LABEL = "演示模型"
_DECLARED = re.compile(r"你正以「(?P<name>[^」]+)」")
_PROMPT_NAME = re.compile(r"你是(?P<name>[^，。,.\s]+)")
_NOTE_SPEAKER = re.compile(r"以下发言来自(?P<who>.+?)(?:——|，|。)")
_QUOTED = re.compile(r"[「“\"'‘](?P<q>[^」”\"'’]+)[」”\"'’]")
_INDEXED_NOTE = re.compile(r"第(?P<n>\d+)条起：(?P<note>.+)")
_SUMMARY_LINE = re.compile(r"- (?P<who>[^：]+)：(?P<text>.*)")
_TOOL_INTENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("get_time", ("几点", "时间", "what time", "the time")),
    ("search_memory", ("搜索记忆", "查一下记忆", "recall")),
    ("take_note", ("记个笔记", "记下来", "take a note")),
)


class DemoChatModel(OfflineChatModel):
    """Offline, deterministic demo model (not a language model)."""

    @property
    def _llm_type(self) -> str:
        return "cyrene-demo"

    def reply_to(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        if (forced := forced_tool(kwargs)) is not None:
            return forced_call(forced, messages)
        return reply(messages, bound_tool_names(kwargs))

    def chunks(self, message: AIMessage) -> Iterator[AIMessageChunk]:
        """Calls in one chunk; text in pieces of up to four characters, like a stream."""
        if message.tool_calls:
            yield as_chunk(AIMessage("", tool_calls=message.tool_calls))
            return
        for piece in re.findall(r".{1,4}", str(message.content), re.DOTALL):
            yield AIMessageChunk(content=piece)


def forced_tool(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The tool a request's `tool_choice` makes the model call (structured output does
    this), as its OpenAI function schema; None when the model may choose."""
    choice, tools = kwargs.get("tool_choice"), kwargs.get("tools") or []
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if choice in (None, "auto", "none") or not tools:
        return None
    named = [t["function"] for t in tools if t["function"]["name"] == choice]
    return named[0] if named else tools[0]["function"]  # "any" / "required": the first


def forced_call(function: dict[str, Any], messages: Sequence[BaseMessage]) -> AIMessage:
    """A call of `function` with arguments made from its schema: a yes/no is yes when the
    last message asks a question, text says it is the demo's."""
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    asked = bool(humans) and message_text(humans[-1]).rstrip().endswith(("?", "？"))
    made = {"boolean": asked, "string": f"（{DEMO_LABEL}）", "integer": 0, "number": 0}
    properties = (function.get("parameters") or {}).get("properties") or {}
    args = {
        key: spec.get("default", made.get(spec.get("type", "string")))
        for key, spec in properties.items()
    }
    return demo_call(function["name"], args)


def demo_call(name: str, args: dict[str, Any]) -> AIMessage:
    """A reply that calls `name` with `args`, under a fresh id."""
    call_id = f"demo-{uuid.uuid4().hex[:12]}"
    return AIMessage(
        "", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}]
    )


def persona_name(messages: Sequence[BaseMessage]) -> str:
    """Who the demo is speaking as: the role declaration, else the persona prompt."""
    for message in messages:
        if isinstance(message, SystemMessage):
            text = message_text(message)
            if ROLE_CONTEXT_MARKER in text and (m := _DECLARED.search(text)):
                return m.group("name")
    first = messages[0] if messages else None
    if isinstance(first, SystemMessage) and (m := _PROMPT_NAME.search(message_text(first))):
        return m.group("name")
    return "助手"


def reply(messages: Sequence[BaseMessage], tools: Collection[str]) -> AIMessage:
    """The demo's deterministic answer to a model view."""
    name = persona_name(messages)
    voice = f"（{DEMO_LABEL}）{name}："
    if messages and isinstance(messages[-1], ToolMessage):
        batch: list[str] = []
        for message in reversed(messages):
            if not isinstance(message, ToolMessage):
                break
            batch.insert(0, message_text(message))
        return AIMessage(voice + "查到了——" + "；".join(batch))
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    text = message_text(humans[-1]) if humans else ""
    for tool, cues in _TOOL_INTENTS:
        # Naming a tool outright makes the demo call it even when it was not
        # offered — a stand-in for a model that insists (restricted denial demo).
        if (tool in tools and any(cue in text.lower() for cue in cues)) or tool in text:
            args = (
                {"query": text}
                if tool == "search_memory"
                else {"text": text}
                if tool == "take_note"
                else {}
            )
            return demo_call(tool, args)
    if "谁说" in text or "who said" in text.lower():
        return AIMessage(voice + who_said(messages, text))
    if m := re.search(r"(?:记住|remember)\s*[:：,，]?\s*(.+)", text, re.IGNORECASE):
        return AIMessage(voice + f"好的，我记住了：{m.group(1).strip()}")
    previous = message_text(humans[-2]) if len(humans) > 1 else ""
    recall = (
        f"你上一句说的是「{previous}」。"
        if previous
        else "更早的话我记在对话摘要里了。"
        if _summary_lines(messages)
        else "这是我们这次对话的第一句。"
    )
    return AIMessage(voice + f"收到「{text}」。{recall}")


def who_said(messages: Sequence[BaseMessage], question: str) -> str:
    """Answer "who said X" from the speaker notes the loop inserted, else from the summary."""
    quoted = _QUOTED.search(question)
    if not quoted:
        return "请用引号告诉我是哪一句话。"
    phrase = quoted.group("q")
    speaker = None
    conversation = [m for m in messages if not isinstance(m, SystemMessage)]
    indexed = _indexed_notes(messages)
    inline_note = None
    for message in messages[:-1]:
        text = message_text(message)
        if isinstance(message, SystemMessage):
            if text.startswith(SPEAKER_SWITCH_MARKER):
                inline_note = text
            continue
        if phrase in text:
            note = inline_note or _note_for(indexed, conversation.index(message) + 1)
            speaker = _NOTE_SPEAKER.search(note) if note else None
    if speaker is not None:
        return f"「{phrase}」是{speaker.group('who')}说的。"
    # Folded by compaction: the summary keeps one "- speaker：text" line per message.
    summarised = [m for line in _summary_lines(messages) if (m := _SUMMARY_LINE.match(line))]
    for line in reversed(summarised):
        if phrase in line.group("text"):
            return f"「{phrase}」是{line.group('who')}说的（对话摘要里记着）。"
    return f"我找不到是谁说了「{phrase}」。"


def _summary_lines(messages: Sequence[BaseMessage]) -> list[str]:
    """The lines of the compaction summary in the view (its own system message, or a
    paragraph of the one leading system message), if there is one."""
    for message in messages:
        text = message_text(message)
        if isinstance(message, SystemMessage) and SUMMARY_PREFIX in text:
            return text.split(SUMMARY_PREFIX, 1)[1].split("\n\n", 1)[0].splitlines()
    return []


def _indexed_notes(messages: Sequence[BaseMessage]) -> list[tuple[int, str]]:
    first = messages[0] if messages else None
    if not isinstance(first, SystemMessage):
        return []
    return [
        (int(m.group("n")), m.group("note")) for m in _INDEXED_NOTE.finditer(message_text(first))
    ]


def _note_for(indexed: list[tuple[int, str]], ordinal: int) -> str | None:
    notes = [note for start, note in indexed if start <= ordinal]
    return notes[-1] if notes else None
