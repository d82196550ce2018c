"""The loop's other model calls (a compactor's, a reply judge's, an extractor's), counted
by purpose beside the replies'.

Those calls are made inside the caller's own code (`LLMCompactor.compact`,
`LLMReplyJudge.judge`, `LLMExtractor.extract_operations`), so they are counted the
way LangChain counts them for `get_usage_metadata_callback`: a callback handler
in a context variable sees every chat-model run that ends inside the measured
call (its threads included, when they copy the context as LangChain's executors
do). The variable is registered once: LangChain's own helper registers a new one
each time it is used, and every later model call would walk them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import reduce
from typing import Any, Literal, TypeVar

from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.messages.ai import UsageMetadata
from langchain_core.tracers.context import register_configure_hook

from nodes.token_accounting.state import TokenUsage
from nodes.token_accounting.usage import clean_usage, summed

Purpose = Literal["compaction", "presence", "extraction", "vision", "middleware"]
"""Why the loop called a model other than to answer: to compact the view, to decide whether
to answer a group turn, to extract memories, to describe an image, in a LangChain
middleware's hook (`LLMToolSelectorMiddleware`'s selection, say)."""
Result = TypeVar("Result")

_MEASURING: ContextVar[UsageMetadataCallbackHandler | None] = ContextVar(
    "cyrene_usage_aside", default=None
)
register_configure_hook(_MEASURING, inheritable=True)


@contextmanager
def measuring() -> Iterator[Callable[[], UsageMetadata | None]]:
    """Within the block, every chat-model call's reported tokens are kept; the function it
    yields sums them (None: none reported). For a call awaited inside the block too."""
    handler = UsageMetadataCallbackHandler()
    token = _MEASURING.set(handler)
    try:
        yield lambda: _total(handler)
    finally:
        _MEASURING.reset(token)


@contextmanager
def unmeasured() -> Iterator[None]:
    """Within the block, no enclosing `measuring` sees the calls (a middleware's wrapper is
    measured, the reply it hands on to is not: the reply is counted as a reply)."""
    token = _MEASURING.set(None)
    try:
        yield
    finally:
        _MEASURING.reset(token)


def measured(call: Callable[..., Result], *args: Any) -> tuple[Result, UsageMetadata | None]:
    """`call(*args)` and the tokens its chat-model calls reported (None: none reported).
    An exception it raises propagates; what it spent before is lost with it."""
    with measuring() as spent:
        result = call(*args)
    return result, spent()


def _total(handler: UsageMetadataCallbackHandler) -> UsageMetadata | None:
    reports = [u for u in map(clean_usage, handler.usage_metadata.values()) if u is not None]
    return reduce(summed, reports) if reports else None


def clean_record(record: Any) -> TokenUsage | None:
    """A stored `token_usage` with its odd counts dropped (None when nothing is left of it)."""
    if not isinstance(record, Mapping):
        return None
    calls = [c for call in record.get("calls") or [] if (c := clean_usage(call)) is not None]
    clean = TokenUsage(turn_id=record.get("turn_id"), calls=calls)
    if calls:
        clean["turn"] = reduce(summed, calls)
    if (session := clean_usage(record.get("session"))) is not None:
        clean["session"] = session
    purposes = record.get("purposes")
    if isinstance(purposes, Mapping):
        kept = {str(k): u for k, v in purposes.items() if (u := clean_usage(v)) is not None}
        if kept:
            clean["purposes"] = kept
    return clean


def with_purpose(
    so_far: TokenUsage | None, purpose: Purpose, usage: UsageMetadata | None
) -> TokenUsage | None:
    """`so_far` with `usage` added to the session's total and to its `purpose`'s; the
    turn's `calls` (the replies') are left as they are. None when there is nothing to record."""
    if usage is None:
        return so_far
    record = TokenUsage(turn_id=None, calls=[]) if so_far is None else TokenUsage(**so_far)
    purposes = dict(record.get("purposes") or {})
    purposes[purpose] = summed(purposes.get(purpose), usage)
    record["purposes"] = purposes
    record["session"] = summed(record.get("session"), usage)
    return record


def add_aside(
    update: dict[str, Any], stored: Any, purpose: Purpose, usage: UsageMetadata | None
) -> None:
    """Record `usage` in a node's `update`, on top of the `token_usage` it already writes,
    else of the session's `stored` one."""
    if record := with_purpose(update.get("token_usage") or clean_record(stored), purpose, usage):
        update["token_usage"] = record
