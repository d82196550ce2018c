"""A summary written before a forget, written again without the forgotten turn.

The summary covers the transcript up to its `upto` (the archive, then the window up to
it) and records the session's forgotten turns it was written without (`Summary.left_out`).
Every round compares the forgotten set (`nodes.context.forgotten`, cached) with that
record: ids, no words. Only when the session has forgotten a turn since is what the
summary covers read (the archive, once): if it holds the opening of a newly forgotten
turn, the summary is written again from the covered messages without every forgotten
turn, never from itself; if not, only its record changes. Either is saved as the
session's summary, so it happens once.

The structural compactor redoes it offline. Any other (an `LLMCompactor`) summarises the
kept messages afresh, oldest first, in runs the size of the budget, the newest
`REWRITE_CALLS` runs at most (older messages stay in the transcript and in conversation
recall); when it fails, the structural summary of the same messages stands in. When the
archive cannot be read, no summary is shown, and the next round tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set
from typing import TYPE_CHECKING

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from nodes.compaction.settings import Compactor, Describe
from nodes.compaction.summary import StructuralCompactor, TokenCounter, in_budget_units
from nodes.context.forgotten import summary_outdated
from nodes.core.state import LoopState, Summary, turn_of, uncovered_start
from nodes.kernel.compat import checkpointer_of, graph_namespace
from nodes.kernel.messages import message_text
from nodes.kernel.run_config import thread_id
from nodes.kernel.transcript import without_turns

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.compaction")

REWRITE_CALLS = 4
"""Calls a model compactor gets to summarise the kept messages again, each a budget's worth."""


def rewritten(
    loop: Loop,
    compactor: Compactor,
    state: LoopState,
    config: RunnableConfig | None,
    forgotten: Set[str],
    *,
    budget: int,
    share: int,
    describe: Describe,
    count: TokenCounter,
) -> Summary | None:
    """The session's summary, written again without `forgotten`'s turns when it covers one
    forgotten since it was written (with only its record brought up to date when it covers
    none); None when the summary names them all. `budget`: the compaction budget; `share`:
    the summary's part of it; `count`: the model's token counter."""
    summary = state.get("summary")
    if summary is None or not summary_outdated(summary, forgotten):
        return None
    record = sorted(forgotten)
    try:
        covered = covered_messages(loop, config, state)
    except Exception:
        log.exception("reading what the summary covers failed; no summary until it is rewritten")
        return Summary(**{**summary, "text": ""})
    newly = forgotten - set(summary.get("left_out", ()))
    if not any(isinstance(m, HumanMessage) and m.id in newly for m in covered):
        return Summary(**{**summary, "left_out": record})
    kept = without_turns(covered, forgotten, answering=False)
    structural = isinstance(compactor, StructuralCompactor)
    text = None if structural else afresh(compactor, kept, budget, share, describe)
    if text is None:
        offline = compactor if structural else StructuralCompactor()
        try:
            text = in_budget_units(offline, count).compact(kept, None, share, describe)
        except Exception:
            log.exception("rewriting the summary failed; no summary until it is rewritten")
            return Summary(**{**summary, "text": ""})
    return Summary(text=text.strip(), upto=summary["upto"], turn=turn_of(state), left_out=record)


def afresh(
    compactor: Compactor, kept: Sequence[BaseMessage], budget: int, share: int, describe: Describe
) -> str | None:
    """`kept` summarised by `compactor` from nothing, run by run (None: it failed or wrote
    nothing; logged)."""
    text: str | None = None
    try:
        for run in runs(kept, budget):
            text = compactor.compact(run, text, share, describe)
    except Exception:
        log.exception("the compactor failed to rewrite the summary; a structural one stands in")
        return None
    if not text or not text.strip():
        log.warning("the compactor rewrote the summary as nothing; a structural one stands in")
        return None
    return text


def runs(messages: Sequence[BaseMessage], budget: int) -> list[list[BaseMessage]]:
    """`messages` cut into runs of about `budget` tokens (a CJK character one, four other
    characters one), oldest first: the newest `REWRITE_CALLS` of them."""
    measure = StructuralCompactor().line_tokens
    cut: list[list[BaseMessage]] = [[]]
    room = float(budget)
    for message in reversed(messages):
        size = measure(message_text(message))
        if cut[-1] and size > room:
            if len(cut) == REWRITE_CALLS:
                break
            cut.append([])
            room = float(budget)
        cut[-1].append(message)
        room -= size
    return [run[::-1] for run in reversed(cut) if run]


def covered_messages(
    loop: Loop, config: RunnableConfig | None, state: LoopState
) -> list[BaseMessage]:
    """Every message the summary covers, oldest first: the archived ones, then the window's
    up to its `upto`. Raises when archived messages cannot be read."""
    messages = state["messages"]
    window: list[BaseMessage] = list(messages[: uncovered_start(messages, state.get("summary"))])
    mark = state.get("archived")
    if not mark or not mark["messages"]:
        return window
    saver = checkpointer_of(config)
    archive = loop.archives(saver) if saver is not None else None
    if archive is None:
        raise RuntimeError("the session has archived messages and no archive to read them from")
    thread = (str(thread_id(config)), graph_namespace(config))
    return [*archive.read(thread, 0, mark["messages"]), *window]
