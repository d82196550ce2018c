"""Each session's archived messages, searchable: a BM25 index in RAM, filled in the background.

The archive (`graph.storage.archive`) is the record; the index is a cache of it,
rebuilt from it after a restart and kept beside the archive object of the process
(`SessionIndexes`). It is the memory store's own lexical engine
(`memory.retrieval.lexical.LexicalIndex`: tantivy, Latin words and trigrams, CJK
characters and bigrams), so a Chinese or an English question finds the words it
shares with what was said, with no model to download.

Scope is structural. An index belongs to one thread (one session), so a search can
only ever return that session's words. Inside it, each message goes to one of two
buckets: what was said in a group or stranger session (a human message the boundary
marked `RESTRICTED`, and every message of the turn it opened) and everything else.
A restricted view searches only the first, an owner's view only the second; so even a
thread whose turns were opened under both (a thread no session binding guards) never
lets an owner's words reach a restricted view.

A forgotten turn (`nodes.context.forgotten`) leaves the index, by ids: its messages are
dropped, and the message after it, indexed with its last one, is indexed again alone
(else that neighbour would surface for the forgotten words, or for any three of their
characters: a recogniser of them). That pass runs in the background too; until it is done,
a search drops every hit whose indexed text may hold a forgotten turn's words.

Writes stay off the turn's path: a round that finds its index behind the archive
hands the catch-up to a background thread and searches what is indexed already. The
one exception is a session's first round in a process, which waits for its index up to
`FIRST_ROUND_WAIT`: a process that runs one turn and exits (`cyrene run`) would
otherwise never recall anything. Text
stays in RAM, as the memory store's lexical index does: no file of the index holds a
word in the clear.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from memory.retrieval.lexical import LexicalIndex
from nodes.core.protocols import TranscriptArchive
from nodes.kernel.messages import message_text
from nodes.kernel.transcript import is_hidden, said_at, said_in_restricted

log = logging.getLogger("cyrene.recall")

OWNER, RESTRICTED = "owner", "restricted"
"""The two buckets of a session's index: an owner's view reads one, a restricted view the other."""
READ_PAGE = 500
"""Archived messages read per query while catching up."""
SESSIONS_KEPT = 8
"""Session indexes a process keeps per archive; the least recently used is dropped (and
rebuilt from the archive when its session speaks again). RAM measured: ~8 MB an index of
50 messages, ~27 MB one of 5,882."""
FIRST_ROUND_WAIT = 1.0
"""Seconds a session's first round in a process waits for its index to be built; measured
here, 6,000 messages index in ~0.6 s and 500 in ~0.1 s."""
Thread = tuple[str, str]


@dataclass(frozen=True)
class Recalled:
    """One archived message a search found."""

    position: int
    """Its place in the session's whole transcript."""
    message: BaseMessage
    when: datetime | None
    """When it was said: its own date, else its turn's (a reply is said in its turn)."""
    turn: str | None
    """The id of the human message that opened its turn (None: before the first one)."""


class SessionIndex:
    """One session's archived messages, by position, searchable by bucket."""

    def __init__(self) -> None:
        self.lexical = LexicalIndex()
        self.indexed = 0
        """Archived positions [0, indexed) are read."""
        self.forgotten: frozenset[str] = frozenset()
        """The turns no entry holds a word of: set after the commits that left them out, so a
        search that reads it first searches an index without them."""
        self._found: dict[str, Recalled] = {}
        self._context: dict[str, str | None] = {}  # the turn of the message indexed with it
        self._bucket_of: dict[str, str] = {}
        self._when: datetime | None = None  # the date of the last dated message read
        self._bucket = OWNER  # the bucket of the last human message read
        self._turn: str | None = None  # the id of the last human message read
        # The last message read, by its bucket: its text and its turn.
        self._previous: dict[str, tuple[str, str | None]] = {}
        self._lock = threading.Lock()

    def catch_up(
        self,
        archive: TranscriptArchive,
        thread: Thread,
        upto: int,
        forgotten: frozenset[str] = frozenset(),
    ) -> None:
        """Leave out the `forgotten` turns, then index archived positions [indexed, upto)."""
        with self._lock:
            self._leave_out(forgotten)
            while self.indexed < upto:
                stop = min(self.indexed + READ_PAGE, upto)
                self._add(self.indexed, archive.read(thread, self.indexed, stop))
                self.indexed = stop

    def _add(self, start: int, messages: Sequence[BaseMessage]) -> None:
        kept: dict[str, tuple[list[str], list[str]]] = {OWNER: ([], []), RESTRICTED: ([], [])}
        for position, message in enumerate(messages, start):
            self._when = said_at(message) or self._when
            if isinstance(message, HumanMessage):
                self._bucket = RESTRICTED if said_in_restricted(message) else OWNER
                self._turn = message.id
            text = message_text(message).strip()
            if self._turn in self.forgotten:
                self._previous = {}  # the message after it is indexed alone
                continue
            if not isinstance(message, HumanMessage | AIMessage) or is_hidden(message) or not text:
                continue  # tool results, system notes, blocked and empty messages
            key = str(position)
            self._found[key] = Recalled(position, message, self._when, self._turn)
            ids, texts = kept[self._bucket]
            ids.append(key)
            # Indexed with the message before it, when of the same bucket: an answer often
            # shares no word with the question that the message it answers holds.
            before, context = self._previous.get(self._bucket, ("", None))
            texts.append(f"{before} {text}" if before else text)
            self._context[key] = context
            self._bucket_of[key] = self._bucket
            self._previous = {self._bucket: (text, self._turn)}
        for bucket, (ids, texts) in kept.items():
            self.lexical.put(bucket, ids, texts)

    def _leave_out(self, forgotten: frozenset[str]) -> None:
        """Drop the entries of turns newly `forgotten`, and index the message after each alone."""
        new = forgotten - self.forgotten
        if not new:
            return
        gone = [key for key, hit in self._found.items() if hit.turn in new]
        self.lexical.remove(gone)
        for key in gone:
            del self._found[key], self._context[key], self._bucket_of[key]
        alone: dict[str, list[str]] = {}
        for key, context in self._context.items():
            if context in new:
                alone.setdefault(self._bucket_of[key], []).append(key)
        for bucket, keys in alone.items():
            texts = [message_text(self._found[key].message).strip() for key in keys]
            self.lexical.put(bucket, keys, texts)
        if any(turn in new for _, turn in self._previous.values()):
            self._previous = {}
        self.forgotten = forgotten

    def search(
        self, query: str, *, restricted: bool, n: int, forgotten: frozenset[str] = frozenset()
    ) -> list[Recalled]:
        """The `n` best messages for `query` in the bucket the view may read, best first,
        none of them scored on the words of a `forgotten` turn."""
        bucket = RESTRICTED if restricted else OWNER
        # Read before searching: the entries of these turns left the searcher asked below.
        stale = forgotten - self.forgotten
        found = self.lexical.search([query], [bucket], n).get(bucket, [])
        hits = [(key, hit) for key in found if (hit := self._found.get(key)) is not None]
        return [
            hit
            for key, hit in hits
            if hit.turn not in forgotten and self._context.get(key) not in stale
        ]


class SessionIndexes:
    """The session indexes of one process, per archive, and the thread that fills them."""

    def __init__(self) -> None:
        self._by_archive: weakref.WeakKeyDictionary[
            TranscriptArchive, OrderedDict[Thread, SessionIndex]
        ] = weakref.WeakKeyDictionary()
        self._pending: dict[tuple[int, Thread], Future[None]] = {}
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="cyrene-recall")

    def of(
        self,
        archive: TranscriptArchive,
        thread: Thread,
        archived: int,
        forgotten: frozenset[str] = frozenset(),
    ) -> SessionIndex:
        """The session's index, its catch-up with the `archived` messages and the `forgotten`
        turns started in the background when it is behind: this round searches what is
        indexed already, or, for an index new to this process, what is indexed within
        `FIRST_ROUND_WAIT`."""
        first: Future[None] | None = None
        with self._lock:
            sessions = self._by_archive.setdefault(archive, OrderedDict())
            known = sessions.get(thread)
            # An index past the archive's end means a fork rewrote the archive, and one that
            # left out a turn no longer forgotten lacks its messages: start again.
            index = (
                known
                if known is not None and known.indexed <= archived and known.forgotten <= forgotten
                else SessionIndex()
            )
            sessions[thread] = index
            new = index is not known
            sessions.move_to_end(thread)
            while len(sessions) > SESSIONS_KEPT:
                sessions.popitem(last=False)
            key = (id(archive), thread)
            behind = index.indexed < archived or index.forgotten != forgotten
            if behind and key not in self._pending:
                self._pending[key] = self._worker.submit(
                    self._catch_up, key, index, archive, thread, archived, forgotten
                )
                first = self._pending[key] if new else None
        if first is not None:
            wait([first], timeout=FIRST_ROUND_WAIT)
        return index

    def _catch_up(
        self,
        key: tuple[int, Thread],
        index: SessionIndex,
        archive: TranscriptArchive,
        thread: Thread,
        archived: int,
        forgotten: frozenset[str],
    ) -> None:
        try:
            index.catch_up(archive, thread, archived, forgotten)
        except Exception:
            log.exception("indexing the archived conversation failed; a later round retries")
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def settled(self, timeout: float | None = None) -> bool:
        """Wait until every catch-up started so far is done (tests, benches); whether all were."""
        with self._lock:
            pending = list(self._pending.values())
        return not wait(pending, timeout=timeout).not_done


SESSION_INDEXES = SessionIndexes()
"""This process's session indexes: one per thread and archive, shared by every graph."""
