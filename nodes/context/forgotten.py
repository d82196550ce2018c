"""The turns whose memories the owner forgot: the model's view leaves them out.

A memory extracted in a turn carries the id of the human message that opened it
(`memory.items.Source.message_id`); a forget keeps that id on the tombstone, and a
store that `KnowsForgottenTurns` names them. Every message of such a turn (the
opening, the replies, tool calls and results) stays in the transcript and out of the
view: out of the live window (`nodes.context.assemble.visible_conversation`) and out
of conversation recall (`nodes.recall.index`, where the message after it, indexed with
its words, is indexed again without them). By ids only: nothing of the forgotten words
is kept to match them with, since any recogniser of a short forgotten text (a PIN, a
name) is a way to recover it.

A summary written before a forget may hold the turn's words: it records the forgotten
turns it was written without (`Summary.left_out`), and one that does not name them all is
not shown until compaction has written it again (`nodes.compaction.rewrite`).

When the store fails to answer, the round goes on with its last answer for the session.
With none, the live window is shown whole (it is what the model answers; leaving it out
would break the turn), and conversation recall is left out for that round (it is an
extra, and the archive is where most forgotten turns are).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Set
from typing import TYPE_CHECKING, cast

from langchain_core.runnables import RunnableConfig

from memory.protocols import KnowsForgottenTurns
from nodes.core.env import SessionEnv
from nodes.core.state import Summary
from nodes.kernel.compat import checkpointer_of, graph_namespace
from nodes.kernel.messages import last_human
from nodes.kernel.run_config import thread_id

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.context")

LAST_READ = "forgotten turns, last read"
"""The loop's memo of each session's last answer, by store (the loop holds its store, so
its id is not reused while the entry lives)."""
ARCHIVE_PAGE = 50
"""Archived messages read at a time, newest first, for the opening of the turn the live
window starts in."""


def forgotten_turns(
    loop: Loop, env: SessionEnv, config: RunnableConfig | None
) -> frozenset[str] | None:
    """The ids of the human messages that opened this session's forgotten turns ({} when the
    store names none), or None when the store failed to answer and never had (logged).

    A store that answered before and fails now (a server restarting) is taken at its last
    answer: what was forgotten does not come back for want of a read."""
    store = loop.config.memory
    if store is None or not names_forgotten_turns(type(store)):
        return frozenset()
    session, thread = loop.session_id(env, config), thread_id(config)
    last: dict[tuple[str | None, str | None], frozenset[str]]
    last = loop.remembered((LAST_READ, id(store)), dict)
    try:
        turns = cast(KnowsForgottenTurns, store).forgotten_turns(session, thread)
    except Exception:
        if (session, thread) in last:
            log.warning("reading the forgotten turns failed; the last read stands", exc_info=True)
            return last[session, thread]
        log.exception("reading the forgotten turns failed; this round shows no recall")
        return None
    last[session, thread] = turns
    return turns


def summary_outdated(summary: Summary | None, forgotten: Set[str]) -> bool:
    """Whether the session forgot a turn since `summary` was written, which it may hold: ids
    against the summary's record, no words (cheap enough for every round)."""
    if not summary or not forgotten:
        return False
    return not forgotten <= set(summary.get("left_out", ()))


@functools.cache
def names_forgotten_turns(kind: type) -> bool:
    """Whether stores of this type are `KnowsForgottenTurns`, worked out once per type: the
    protocol's own check costs ~45 µs, and a round asks two or three times."""
    return issubclass(kind, KnowsForgottenTurns)


def window_opener(loop: Loop, config: RunnableConfig | None, archived: int) -> str | None:
    """The id of the last archived human message: the opening of the turn the live window
    starts in, when compaction cut inside that turn (None: none, no archive, or the archive
    cannot say; logged)."""
    try:
        return archived_opener(loop, config, archived)
    except Exception:
        log.exception("reading the archive for the window's opening failed; it stays in view")
        return None


def archived_opener(loop: Loop, config: RunnableConfig | None, archived: int) -> str | None:
    """The id of the last archived human message (None: none, or no archive)."""
    saver = checkpointer_of(config)
    archive = loop.archives(saver) if saver is not None and archived else None
    if archive is None:
        return None
    thread = (str(thread_id(config)), graph_namespace(config))
    stop = archived
    while stop > 0:
        start = max(0, stop - ARCHIVE_PAGE)
        human = last_human(archive.read(thread, start, stop))
        if human is not None:
            return human.id
        stop = start
    return None
