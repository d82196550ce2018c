"""The recalled conversation the model sees: a heading, then one dated line per message.

Each round searches the session's archived messages (`nodes.recall.index`) with the
latest user text, takes the best hits that fit `ConversationRecall.max_tokens`, and
shows them oldest first, each as `- [date speaker] text`, the text one line of data
(`nodes.kernel.text.as_data`): what someone said once cannot start a line of the
loop's system text. The view puts the block after the memory block, under the same
restricted marker when the view is a group's or a stranger's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig

from memory.embedding import is_cjk_run, runs
from memory.retrieval.block import RESTRICTED_MARKER
from nodes.core.env import SessionEnv
from nodes.kernel.compat import checkpointer_of, graph_namespace
from nodes.kernel.messages import message_text
from nodes.kernel.run_config import thread_id
from nodes.kernel.text import as_data
from nodes.recall.index import SESSION_INDEXES, Recalled
from nodes.recall.settings import ConversationRecall

if TYPE_CHECKING:
    from nodes.core.loop import Loop

RECALL_HEADER = "对话回忆（更早的对话里与此相关的原话，按时间排序，带日期与发言人）："
CANDIDATES = 32
"""Hits read per search; the block keeps the best that fit its budget."""
UNDATED = "日期不详"
YOU = "你"
Describe = Callable[[BaseMessage], str]


def estimated_tokens(text: str) -> int:
    """A text's tokens, estimated: a CJK character one, four other characters one (an
    estimate by characters alone would count Chinese four times too cheap)."""
    cjk = sum(len(run) for run in runs(text) if is_cjk_run(run))
    return cjk + -(-(len(text) - cjk) // 4)


def recall_block(
    loop: Loop,
    env: SessionEnv,
    config: RunnableConfig | None,
    archived: int,
    query: str,
    describe: Describe,
    forgotten: frozenset[str] | None = frozenset(),
) -> str:
    """This round's recalled conversation from the session's `archived` messages, or ''
    (off, nothing archived, no query, no hit, or `forgotten` unknown: None). A message of a
    turn `forgotten` opened is never shown, nor found by its words (`nodes.context.forgotten`)."""
    budget = loop.feature(ConversationRecall).max_tokens
    saver = checkpointer_of(config)
    if budget <= 0 or not archived or saver is None or not query.strip() or forgotten is None:
        return ""
    archive = loop.archives(saver)
    if archive is None:
        return ""
    thread = (str(thread_id(config)), graph_namespace(config))
    index = SESSION_INDEXES.of(archive, thread, archived, forgotten)
    hits = index.search(query, restricted=env.restricted, n=CANDIDATES, forgotten=forgotten)
    speaker = partial(speaker_of, current=loop.persona_for(env), describe=describe)
    return format_recall(hits, budget, restricted=env.restricted, speaker=speaker, zone=loop.zone)


def speaker_of(message: BaseMessage, *, current: str | None, describe: Describe) -> str:
    """Who said it: `你` for the answering persona's own words, else `describe`'s label."""
    mine = isinstance(message, AIMessage) and (message.name or current) == current
    return YOU if mine else describe(message)


def format_recall(
    hits: Sequence[Recalled],
    budget: int,
    *,
    restricted: bool,
    speaker: Describe,
    zone: ZoneInfo | None = None,
) -> str:
    """The heading and the best `hits` that fit `budget` tokens ('' if none fit): under a
    line for each date, oldest first, `- speaker：text`."""
    heading = (f"{RESTRICTED_MARKER}：" if restricted else "") + RECALL_HEADER
    room = budget - estimated_tokens(heading)
    days: dict[str, list[tuple[int, str]]] = {}
    for hit in hits:
        day = date_of(hit, zone)
        line = f"\n- {speaker(hit.message)}：{as_data(message_text(hit.message))}"
        cost = estimated_tokens(line) + (0 if day in days else estimated_tokens(f"\n[{day}]"))
        if cost <= room:
            days.setdefault(day, []).append((hit.position, line))
            room -= cost
    if not days:
        return ""
    groups = sorted((sorted(lines), day) for day, lines in days.items())
    return heading + "".join(f"\n[{day}]" + "".join(t for _, t in lines) for lines, day in groups)


def date_of(hit: Recalled, zone: ZoneInfo | None) -> str:
    """The hit's date, in the loop's zone when one is set and the date has an offset."""
    if hit.when is None:
        return UNDATED
    when = hit.when.astimezone(zone) if zone is not None and hit.when.tzinfo else hit.when
    return f"{when:%Y-%m-%d}"
