"""`extract_memory`: turn the finished conversation into long-term memories.

Restricted
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
message starts a new run on top of it, and LangGraph drops what the old run
had left. So the first message of every run's input carries its turn's
`SessionEnv` (`TURN_OPENED`, stamped by `graph.runs`; a resume runs as it too),
and the state keeps the opener of the latest turn this node ran for
(`extracted_turn`): a turn opened after it and before the current one died, and
this node extracts it as that turn would have (its persona, its session; a
restricted one never), under the key its run would have used, so the ledger
still runs it once. Only turns a run with an extractor opened count
(`TURN_EXTRACTS`): imported history, `update_state` edits and turns run before
the extractor was configured open none.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.runtime import Runtime

from memory.items import Source
from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.extraction import background
from nodes.extraction.background import BackgroundJobs, ExtractionJob, SpentTokens
from nodes.extraction.ledger import Record, extraction_ledger_for
from nodes.extraction.planning import apply_changes, plan_extraction
from nodes.extraction.plans import planned_once
from nodes.extraction.settings import (
    EXTRACTED_TURN,
    PENDING,
    Extraction,
    ExtractionState,
    PendingExtraction,
)
from nodes.kernel.compat import sync_node
from nodes.kernel.messages import last_human
from nodes.kernel.run_config import thread_id
from nodes.kernel.transcript import (
    annotated,
    annotations_of,
    is_hidden,
    said_in_restricted,
    turn_number,
    turn_start,
)
from nodes.token_accounting.aside import add_aside, measured

log = logging.getLogger("cyrene.memory")

TURN_OPENED = "turn"
"""Annotation of the first message of a run's input: the run's `SessionEnv` fields, with
the persona it answers as."""
TURN_EXTRACTS = "extracts"
"""Beside `TURN_OPENED`: whether the run had an extractor (only such turns are recovered);
a record without it was written when only such runs kept one."""


def spent() -> SpentTokens:
    """This process's count of what background extractions spent
    (`nodes.extraction.background.SPENT`; read at each use: a forked child has its own)."""
    return background.SPENT


def background_jobs(loop: Loop) -> BackgroundJobs:
    """The graph's handle on the process-wide background pipeline (its deadline, its counts)."""
    return loop.remembered(BackgroundJobs, lambda: BackgroundJobs(loop.feature(Extraction).timeout))


def extraction_key(thread_id: str | None, opening: Sequence[BaseMessage]) -> str:
    """One turn's extraction: its thread and the messages that opened it, by id and words.

    Not its reply, which a replay of the turn from an earlier checkpoint (Studio's
    replay) gives a new id: the replay would extract again, and bring back what the owner
    has forgotten since. The same words under the same ids are the same turn however
    often it is replayed; words edited in place under the same id are other words, so
    another key, and an extractor may read them (an `update_state` edit is stamped
    restricted today, so none does). Checkpoints keep each pending entry's own key: one
    saved under an earlier form of the key still settles under it.
    """
    turn = [thread_id or "", [[m.id, m.content] for m in opening]]
    text = json.dumps(turn, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def extractable(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """What an extractor may read: no guard-hidden message, no third party's words, and no
    reply to words said in a group or stranger session.

    A human message with a display name is someone other than the owner; an
    extractor that never sees it can never store it as the owner's or a
    persona's memory, whatever the extractor (a rule, a model) makes of the rest.
    A reply in a restricted turn may repeat what a stranger said ("小明说主人欠他钱"),
    so it goes with the words it answers.
    """
    kept: list[BaseMessage] = []
    answering_restricted = False
    for message in messages:
        if isinstance(message, HumanMessage):
            answering_restricted = said_in_restricted(message)
        elif answering_restricted:
            continue  # the reply and tool results of a restricted turn
        if readable(message):
            kept.append(message)
    return kept


def readable(message: BaseMessage) -> bool:
    """Whether an extractor may read the message (see `extractable`); never words said in a
    group or stranger session (`nodes.boundary.admission` stamps them), whichever turn they are in."""
    if is_hidden(message) or said_in_restricted(message):
        return False
    return not (isinstance(message, HumanMessage) and message.name)


def opening_messages(messages: Sequence[BaseMessage]) -> list[HumanMessage]:
    """The human messages that opened the latest turn (several when a burst was merged)."""
    opening: list[HumanMessage] = []
    for index in range(turn_start(messages), -1 if messages else 0, -1):
        message = messages[index]  # by index: a slice would copy a long transcript
        if not isinstance(message, HumanMessage):
            break
        opening.append(message)
    return opening[::-1]


def opened_turn(input: dict[str, Any], env: SessionEnv, *, extracts: bool) -> dict[str, Any]:
    """A run's input with its first message stamped as opening a turn under `env` (its
    persona resolved), and whether the run extracts memories."""
    messages = input.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], BaseMessage):
        return input
    stamps = {TURN_OPENED: env.model_dump(exclude={"mentioned"}), TURN_EXTRACTS: extracts}
    return {**input, "messages": [annotated(messages[0], **stamps), *messages[1:]]}


def turn_env(messages: Sequence[BaseMessage]) -> SessionEnv | None:
    """The `SessionEnv` of the latest turn a run opened (what a resume continues as), or
    None when no message in the window records one."""
    for index in range(len(messages) - 1, -1, -1):
        if fields := annotations_of(messages[index]).get(TURN_OPENED):
            return SessionEnv(**fields)
    return None


def _extracting_opener(message: BaseMessage) -> bool:
    notes = annotations_of(message)
    return TURN_OPENED in notes and notes.get(TURN_EXTRACTS, True)


def turn_openers(messages: Sequence[BaseMessage], extracted: str | None) -> list[int]:
    """Where the turns opened after `extracted` (the opener of the latest turn extracted)
    start, oldest first; the last is this run's turn (or the one it resumes). If that
    opener is no longer in the window, only the last: which of the others were extracted
    is not known."""
    openers: list[int] = []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if extracted is not None and message.id == extracted:
            return openers[::-1]
        if _extracting_opener(message):
            openers.append(index)
    return openers[::-1] if extracted is None else openers[:1]


def dead_turns(
    messages: Sequence[BaseMessage], openers: Sequence[int]
) -> list[tuple[Sequence[BaseMessage], SessionEnv]]:
    """The turns opened at `openers` that died before this node (all but the last), each as
    the transcript up to its end and its `SessionEnv`. One that got no reply is left out:
    its words open the next turn, whose extraction reads them."""
    dead = []
    for start, end in itertools.pairwise(openers):
        if all(isinstance(m, HumanMessage) for m in messages[start:end]):
            continue
        fields = annotations_of(messages[start])[TURN_OPENED]
        dead.append((messages[:end], SessionEnv(**fields)))
    return dead


def extract_waiting(loop: Loop, config: RunnableConfig, values: dict[str, Any]) -> int:
    """For a session whose run died just before this node (its checkpoint waits here): do
    what this node would have for the turn and any dead before it (run an inline extractor,
    or hand the background its jobs); how many turns.

    `graph.resume_extractions` calls it at start, so such a turn's memory is stored even if
    the session never speaks again. A turn without its opener's record (saved before
    records were kept) is left alone: who spoke in it is not known.
    """
    messages = values.get("messages", [])
    openers = turn_openers(messages, values.get("extracted_turn"))
    if not openers or loop.config.extractor is None or loop.config.memory is None:
        return 0
    last = SessionEnv(**annotations_of(messages[openers[-1]])[TURN_OPENED])
    turns = [*dead_turns(messages, openers), (messages, last)]
    extracted = extract_turns(loop, config, turns, backlog=True, archived=archived_humans(values))
    if getattr(loop.config.extractor, "background", False):
        return len(extracted)
    return sum(not env.restricted for _, env in turns)


def archived_humans(values: Mapping[str, Any]) -> int:
    """How many of the session's human messages the archive holds (before the window)."""
    mark = values.get("archived")
    return mark["humans"] if mark else 0


def snapshot_until(messages: Sequence[BaseMessage], boundary: str) -> list[BaseMessage] | None:
    """What the extractor saw: `extractable` messages up to `boundary`; None if it is gone."""
    for index, message in enumerate(messages):
        if message.id == boundary:
            return extractable(messages[: index + 1])
    return None


def opened_by(messages: Sequence[BaseMessage]) -> str | None:
    """The id of the human message the turn `messages` end with was opened by in its thread:
    with the thread, what a forget of its memories takes out of that thread's view, whatever
    session and turn ids the app stamped (`Source.opening_id`)."""
    human = last_human(messages)
    return human.id if human else None


def job_for(loop: Loop, entry: PendingExtraction, snapshot: Sequence[BaseMessage]) -> ExtractionJob:
    """The background job that runs `entry` on `snapshot` (the config has an extractor)."""
    extractor, store = loop.config.extractor, loop.config.memory
    assert extractor is not None and store is not None
    source = Source(
        session_id=entry["session_id"],
        message_id=entry["message_id"],
        extraction=entry["key"],
        thread_id=entry.get("thread"),
        opening_id=opened_by(snapshot),
    )
    return ExtractionJob(
        key=entry["key"],
        session=entry.get("thread"),
        order=entry.get("order", 0),
        extract=spent().counting(
            store,
            entry.get("thread"),
            partial(
                plan_extraction,
                extractor,
                snapshot,
                store,
                persona_id=entry["persona_id"],
                source=source,
            ),
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
    store = loop.config.memory
    for entry in pending:
        key = entry["key"]
        if background_jobs(loop).settled(store, key):
            continue
        if not background_jobs(loop).known(store, key):
            snapshot = snapshot_until(messages, entry["boundary"])
            job = job_for(loop, entry, snapshot or [])
            if snapshot is None:  # marked lost, unless another process already ran it
                job.abandon = "cannot run: its turn is no longer in the transcript"
            background_jobs(loop).submit(job, backlog)
        kept.append(entry)
    return kept


def extract_turn(
    loop: Loop,
    env: SessionEnv,
    config: RunnableConfig,
    messages: Sequence[BaseMessage],
    backlog: bool = False,
    archived: int = 0,
) -> list[PendingExtraction]:
    """Extract the turn `messages` end with, as `env` ran it: inline, or handed to the
    background (`backlog`: even over the queue's capacity) and returned as pending.

    Either way exactly once: a background job through the pipeline, an inline one by
    its plan, recorded in the store's ledger before it is applied (`planned_once`).
    `archived` counts the session's human messages before the window (turn order).
    """
    extractor, store = loop.config.extractor, loop.config.memory
    assert extractor is not None and store is not None
    human = last_human(messages)
    if human is not None and is_hidden(human):
        return []  # a guard-blocked turn's text must reach no model, extractors included
    opening = opening_messages(messages)
    if not any(readable(h) for h in opening):
        # Only third parties spoke, or words put in outside a turn (an `update_state` edit):
        # nothing of the owner's to remember, and the snapshot would end in earlier turns.
        return []
    snapshot = extractable(messages)
    persona_id = loop.persona_for(env)
    source = Source(
        session_id=loop.session_id(env, config),
        message_id=loop.turn_id(env, messages),
        thread_id=thread_id(config),
        opening_id=opened_by(messages),
    )
    boundary = str(snapshot[-1].id)
    entry = PendingExtraction(
        key=extraction_key(thread_id(config), opening),
        boundary=boundary,
        session_id=source.session_id,
        message_id=source.message_id,
        persona_id=persona_id,
        thread=thread_id(config),
        order=archived + turn_number(messages),
    )
    if getattr(extractor, "background", False):
        background_jobs(loop).submit(job_for(loop, entry, snapshot), backlog)
        return [entry]
    plan = partial(
        plan_extraction, extractor, snapshot, store, persona_id=persona_id, source=source
    )
    try:
        ledger = extraction_ledger_for(store)
        if (changes := planned_once(ledger, entry["key"], plan)) is not None:
            apply_changes(store, changes)
            ledger.write({entry["key"]: Record("done", 1)})  # and its plan (text) goes
    except Exception:
        log.exception("memory extraction failed; the turn goes on")
    return []


def extract_turns(
    loop: Loop,
    config: RunnableConfig,
    turns: Sequence[tuple[Sequence[BaseMessage], SessionEnv]],
    backlog: bool = False,
    archived: int = 0,
) -> list[PendingExtraction]:
    """`extract_turn` for each (transcript up to the turn's end, its env); a group or
    stranger turn never."""
    return [
        entry
        for turn, env in turns
        if not env.restricted
        for entry in extract_turn(loop, env, config, turn, backlog, archived)
    ]


def make_extract_memory(loop: Loop) -> Runnable[Any, Any]:
    def extract_memory(
        state: ExtractionState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Run the extractor on this turn (in the background if it asks), and on the turns
        whose runs died before getting here; never in group/stranger chats."""
        env = env_of(runtime)
        if loop.config.extractor is None or loop.config.memory is None:
            return {}
        messages = state["messages"]
        openers = turn_openers(messages, state.get("extracted_turn"))
        update: dict[str, Any] = {}
        if openers and (opener := str(messages[openers[-1]].id)) != state.get("extracted_turn"):
            update[EXTRACTED_TURN] = opener
        if env.restricted:
            return update
        # What background extractions spent since the session's last step (this step's own
        # are taken at its next one); inline ones are measured as they run.
        spent_aside = spent().take(loop.config.memory, thread_id(config))
        carried = state.get("pending_extractions", [])
        pending = resubmit(loop, carried, messages)
        turns = [*dead_turns(messages, openers), (messages, env)]
        extracted, spent_inline = measured(
            extract_turns, loop, config, turns, False, archived_humans(state)
        )
        pending += extracted
        if pending != carried:
            update[PENDING] = pending
        stored = state.get("token_usage")
        for usage in (spent_aside, spent_inline):
            add_aside(update, stored, "extraction", usage)
        return update

    return sync_node(extract_memory, "extract_memory")
