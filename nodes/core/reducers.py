"""The reducers of the transcript channels, light enough to read a session without the loop.

`merge_transcript` folds a step's writes into `messages` (a `DeltaChannel`),
`latest_summary` keeps compaction's latest summary. A reader of a stored
session (`graph.storage.reading`, behind `cyrene history`) folds the stored
writes with these same functions, so this module imports only LangChain's
message types: LangGraph's `add_messages` is loaded on the path that needs it
(a write that replaces or removes a stored message), not on every import.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, TypeVar, cast

from langchain_core.messages import BaseMessage, BaseMessageChunk, HumanMessage, RemoveMessage

from nodes.kernel.transcript import close_interrupted_calls, open_calls_start

T = TypeVar("T")

REMOVE_ALL_MESSAGES = "__remove_all__"
"""LangGraph's id for "remove every message" (`langgraph.graph.message`; tests/test_compat.py
checks it is the same)."""


def add_messages(current: list[BaseMessage], batch: list[Any]) -> list[BaseMessage]:
    """LangGraph's `add_messages`, imported when first needed (it loads LangGraph's graph
    package, most of a second that a transcript reader never spends)."""
    from langgraph.graph.message import add_messages as langgraph_add_messages

    return cast(list[BaseMessage], langgraph_add_messages(cast(Any, current), cast(Any, batch)))


def merge_transcript(current: list[BaseMessage], writes: Sequence[Any]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` over a batch, then close dangling calls.

    A human message and a reply or tool result never replace each other when
    they happen to share an id (`kept_apart`): `add_messages` replaces by id,
    so an inbound message under a reply's id would orphan a tool call, and a
    reply under the user's message id would lose what the user said.

    Both steps depend only on the resulting list, so the reducer is
    batching-invariant as `DeltaChannel` requires. It runs on every step and
    every load, so the usual step (new messages appended) costs one pass over
    the ids and a look at the tail, not `add_messages`' passes over the list;
    a step that replaces or removes messages by id (the turn-end hook's rewrite,
    compaction) is folded here too (`replaced_by_id`), and only chunks, messages
    without an id or "remove all" go to `add_messages` itself.
    tests/test_transcript_reducer.py checks every path against the definition.
    """
    batch: list[Any] = [
        m for write in writes for m in (write if isinstance(write, list) else [write])
    ]
    if only_new_messages(current, batch):
        merged: list[BaseMessage] = [*current, *batch]  # what `add_messages` would return
    else:
        # One pass over the whole batch applies the writes in order, as one call per
        # write would; whole messages need no `add_messages` (nor its import).
        moved = kept_apart(current, batch)
        light = replaced_by_id(current, moved) if all(by_id(m) for m in moved) else None
        merged = add_messages(current, moved) if light is None else light
        if merged[: len(current)] != current:  # a write replaced or removed a stored message
            return close_interrupted_calls(merged)
    # `current` is already closed, so only the calls of its last reply can be left
    # open: closing starts there.
    start = open_calls_start(current)
    tail = merged[start:]
    closed = close_interrupted_calls(tail)
    return merged if closed is tail else [*merged[:start], *closed]


def whole_message(message: Any) -> bool:
    """A message with an id that is neither a chunk nor a removal: `add_messages` only
    replaces (by id) or appends it."""
    whole = _WHOLE_KINDS.get(type(message))
    return (_whole_kind(type(message)) if whole is None else whole) and bool(message.id)


_WHOLE_KINDS: dict[type, bool] = {}
"""Each class met → whether its instances are whole messages (a load folds every write since
the last snapshot, and three `isinstance` checks against pydantic's ABC classes per message
cost more than the fold)."""


def _whole_kind(kind: type) -> bool:
    whole = issubclass(kind, BaseMessage) and not issubclass(kind, BaseMessageChunk | RemoveMessage)
    _WHOLE_KINDS[kind] = whole
    return whole


def replaced_by_id(
    current: list[BaseMessage], batch: list[BaseMessage]
) -> list[BaseMessage] | None:
    """What `add_messages` returns for whole messages and removals by id: each message
    replaces the one holding its id, in place, or is appended; a removal drops its id.
    None when a removal names an id nobody holds (`add_messages` raises for that). The
    usual steps take this path with no LangGraph import: a reply the turn-end hook
    rewrites with its mood, compaction moving messages to the archive."""
    merged = list(current)
    at = {m.id: i for i, m in enumerate(merged)}
    removed: set[str | None] = set()
    for message in batch:
        if isinstance(message, RemoveMessage):
            if message.id not in at:
                return None
            removed.add(message.id)
        elif message.id in at:
            removed.discard(message.id)
            merged[at[message.id]] = message
        else:
            at[message.id] = len(merged)
            merged.append(message)
    return [m for m in merged if m.id not in removed] if removed else merged


def by_id(message: Any) -> bool:
    """A whole message, or the removal of one message, by id: what `replaced_by_id` folds."""
    if isinstance(message, RemoveMessage):
        return bool(message.id) and message.id != REMOVE_ALL_MESSAGES
    return whole_message(message)


_ID = attrgetter("id")


def only_new_messages(current: Sequence[BaseMessage], batch: Sequence[Any]) -> bool:
    """Every write is a whole message (no chunk, removal or dict) with an id that neither
    the transcript nor an earlier write holds: `add_messages` would only append."""
    ids = set()
    for message in batch:
        if not whole_message(message) or message.id in ids:
            return False
        ids.add(message.id)
    return ids.isdisjoint(map(_ID, current))  # no list: it runs every step and load


def kept_apart(current: Sequence[BaseMessage], batch: list[Any]) -> list[Any]:
    """`batch` with each message whose id belongs to a message on the other side of the
    human / not-human line (one stored, or earlier in the batch) moved to a derived id.

    What a person said and what the loop answered never overwrite each other:
    a platform id can collide with a stored reply's, and a provider can answer
    under the id the platform gave the user's message. Re-sending a human
    message under its id still replaces it (that is how a retried message is
    stored once), and a reply rewritten under its id still replaces the reply.
    The derived id (`m1#ai`, `m1#human`, `m1#tool`; suffixed again while the
    other side holds that too) is the same on every replay, so a later
    rewrite of a moved message lands on the moved copy. Only what comes before
    a message counts, so folding writes one by one or all at once moves the same ones.
    """
    held_by_human: dict[str | None, bool] = {
        m.id: isinstance(m, HumanMessage) for m in current if m.id
    }
    """id → whether a human message holds it, as of the message being looked at."""
    moved = []
    for message in batch:
        if isinstance(message, RemoveMessage):
            if message.id == REMOVE_ALL_MESSAGES:
                held_by_human.clear()
            held_by_human.pop(message.id, None)
        elif isinstance(message, BaseMessage) and message.id:
            human = isinstance(message, HumanMessage)
            free_id = message.id
            while held_by_human.get(free_id, human) != human:
                free_id = f"{free_id}#{message.type}"
            if free_id != message.id:
                message = message.model_copy(update={"id": free_id})
            held_by_human[free_id] = human
        moved.append(message)
    return moved


def latest_summary(current: T, writes: Sequence[T]) -> T:
    """DeltaChannel reducer for `summary`: the latest write wins (batching-invariant)."""
    return writes[-1] if writes else current
