"""`extract_memory`: turn the finished conversation into long-term memories.

Seed `extractMemory` / `extractMemoryAsync` / `persistMemories`: restricted
sessions never write; every item is stamped with the turn's persona and real
provenance; an extractor with `background = True` runs off the reply path on
a snapshot, under a deadline; failures are logged, never raised into the turn.

A background extraction is durable: the node records it in the session's
state (`pending_extractions`), and the graph saves that checkpoint before the
turn returns, so a crash after the reply cannot lose it. Each run of this
node re-submits the session's recorded extractions that this process has not
seen settle (after a restart: all of them; the memory store's ledger skips
the finished ones) and drops the settled ones, so the list stays short.
`graph.resume_extractions` does the same for every session when a process
starts.

A turn whose process died between its reply and this node is extracted by
the next one. Resuming it (`invoke(None)`) would run this node, but a new
message starts a new run on top of it and LangGraph drops what the old one
had left; the state's `extracted_through` (the last message an extraction
covered) shows that words came after it, so the next turn submits that
turn's extraction too, under the key the dead one would have used (the ledger
still runs it once).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from memory.background import ExtractionJob
from memory.items import Source
from memory.planning import apply_changes, plan_extraction
from memory.transcript import last_human
from nodes.env import SessionEnv, env_of
from nodes.loop import Loop
from nodes.run_config import thread_id
from nodes.state import LoopState, PendingExtraction
from nodes.view.transcript import is_hidden, turn_start

log = logging.getLogger("cyrene.memory")

PENDING = "pending_extractions"
EXTRACTED = "extracted_through"


def extraction_key(thread_id: str | None, boundary: str) -> str:
    """One turn's extraction: its thread and the id of the turn's last message."""
    return hashlib.sha256(f"{thread_id or ''}\x00{boundary}".encode()).hexdigest()[:32]


def extractable(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """What an extractor may read: no guard-hidden message, and no third party's words.

    A human message with a display name is someone other than the owner; an
    extractor that never sees it can never store it as the owner's or a
    persona's memory, whatever the extractor (a rule, a model) makes of the rest.
    """
    return [m for m in messages if readable(m)]


def readable(message: BaseMessage) -> bool:
    """Whether an extractor may read the message (see `extractable`)."""
    return not is_hidden(message) and not (isinstance(message, HumanMessage) and message.name)


def opening_messages(messages: Sequence[BaseMessage]) -> list[HumanMessage]:
    """The human messages that opened the latest turn (several when a burst was merged)."""
    opening: list[HumanMessage] = []
    for index in range(turn_start(messages), -1 if messages else 0, -1):
        message = messages[index]  # by index: a slice would copy a long transcript
        if not isinstance(message, HumanMessage):
            break
        opening.append(message)
    return opening[::-1]


def covered_through(messages: Sequence[BaseMessage]) -> str | None:
    """The id an extraction of `messages` ends at: their last `extractable` message's."""
    return next((str(m.id) for m in reversed(messages) if readable(m)), None)


def unextracted_turn(messages: Sequence[BaseMessage], through: str | None) -> int:
    """How many of `messages` end a turn before this one that no extraction covered; 0 if none.

    That turn got a reply (otherwise its words open this turn too, and this
    turn's extraction reads them) and has a human message after `through`,
    the end of the last extraction.
    """
    opening = opening_messages(messages)
    start = turn_start(messages) + 1 - len(opening) if opening else 0
    for index in range(start - 1, -1, -1):
        message = messages[index]
        if message.id == through:
            return 0
        if isinstance(message, HumanMessage):
            return start
    return 0


def snapshot_until(messages: Sequence[BaseMessage], boundary: str) -> list[BaseMessage] | None:
    """What the extractor saw: `extractable` messages up to `boundary`; None if it is gone."""
    for index, message in enumerate(messages):
        if message.id == boundary:
            return extractable(messages[: index + 1])
    return None


def job_for(loop: Loop, entry: PendingExtraction, snapshot: Sequence[BaseMessage]) -> ExtractionJob:
    """The background job that runs `entry` on `snapshot` (the config has an extractor)."""
    extractor, store = loop.config.extractor, loop.config.memory
    assert extractor is not None and store is not None
    source = Source(
        session_id=entry["session_id"], message_id=entry["message_id"], extraction=entry["key"]
    )
    return ExtractionJob(
        key=entry["key"],
        extract=partial(
            plan_extraction,
            extractor,
            snapshot,
            store,
            persona_id=entry["persona_id"],
            source=source,
        ),
        persona_id=entry["persona_id"],
        source=source,
        store=store,
    )


def resubmit(
    loop: Loop,
    pending: Sequence[PendingExtraction],
    messages: Sequence[BaseMessage],
    backlog: bool = False,
) -> list[PendingExtraction]:
    """Hand this process the recorded extractions it has not got; return those not yet settled.

    `backlog` (recovery at start) queues them even over the queue's capacity.
    """
    kept: list[PendingExtraction] = []
    for entry in pending:
        key = entry["key"]
        if loop.jobs.settled(key):
            continue
        if not loop.jobs.known(key):
            snapshot = snapshot_until(messages, entry["boundary"])
            job = job_for(loop, entry, snapshot or [])
            if snapshot is None:  # marked lost, unless another process already ran it
                job.abandon = "cannot run: its turn is no longer in the transcript"
            loop.jobs.submit(job, backlog)
        kept.append(entry)
    return kept


def extract_turn(
    loop: Loop,
    env: SessionEnv,
    config: RunnableConfig,
    messages: Sequence[BaseMessage],
    earlier: bool = False,
) -> list[PendingExtraction]:
    """Extract the turn `messages` end with: inline, or handed to the background and
    returned as pending. An `earlier` turn (not this run's) is stamped with its own last
    human message, not the run's `SessionEnv.turn_id`."""
    extractor, store = loop.config.extractor, loop.config.memory
    assert extractor is not None and store is not None
    human = last_human(messages)
    if human is not None and is_hidden(human):
        return []  # a guard-blocked turn's text must reach no model, extractors included
    if not any(not h.name for h in opening_messages(messages)):
        return []  # only third parties spoke: nothing of the owner's to remember
    snapshot = extractable(messages)
    persona_id = loop.persona_for(env)
    message_id = human.id if earlier and human is not None else loop.turn_id(env, messages)
    source = Source(session_id=loop.session_id(env, config), message_id=message_id)
    if getattr(extractor, "background", False):
        boundary = str(snapshot[-1].id)
        entry = PendingExtraction(
            key=extraction_key(thread_id(config), boundary),
            boundary=boundary,
            session_id=source.session_id,
            message_id=source.message_id,
            persona_id=persona_id,
        )
        loop.jobs.submit(job_for(loop, entry, snapshot))
        return [entry]
    try:
        changes = plan_extraction(extractor, snapshot, store, persona_id=persona_id, source=source)
        apply_changes(store, changes)
    except Exception:
        log.exception("memory extraction failed; the turn goes on")
    return []


def make_extract_memory(loop: Loop):
    def extract_memory(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Run the extractor on this turn (in the background if it asks), and on an
        earlier one a crash left unextracted; never in group/stranger chats."""
        env = env_of(runtime)
        if loop.config.extractor is None or loop.config.memory is None:
            return {}
        messages = state["messages"]
        through = state.get("extracted_through")
        update: dict[str, Any] = {}
        if (now_through := covered_through(messages)) != through:
            update[EXTRACTED] = now_through  # a restricted turn is covered too: never extracted
        if env.restricted:
            return update
        carried = state.get("pending_extractions", [])
        pending = resubmit(loop, carried, messages)
        if earlier := unextracted_turn(messages, through):
            pending += extract_turn(loop, env, config, messages[:earlier], earlier=True)
        pending += extract_turn(loop, env, config, messages)
        if pending != carried:
            update[PENDING] = pending
        return update

    return extract_memory
