"""Scripted replies: what the emulated model answers, request by request.

A test queues replies (`Reply`, or a function of the `Request` returning one)
and may set a responder for every request after the queue runs dry; with
neither, the model answers `DEFAULT_TEXT`. Only requests that generate a reply
take from the script (a token count does not).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.emulator.wire import Request

DEFAULT_TEXT = "好的。"


@dataclass(frozen=True)
class Call:
    """A tool call the model makes; the emulator gives it an id when `id` is None."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """What the model answers: text, tool calls, and (Anthropic, with thinking enabled)
    the thinking it shows first, signed as the API signs it."""

    text: str = ""
    calls: tuple[Call, ...] = ()
    thinking: str | None = None


def call(name: str, id: str | None = None, **args: Any) -> Reply:
    """A reply that makes one tool call."""
    return Reply(calls=(Call(name, args, id),))


Responder = Callable[[Request], Reply]
Entry = Reply | Responder


class Script:
    """The queue of replies, then the responder."""

    def __init__(self) -> None:
        self._queue: deque[Entry] = deque()
        self._responder: Responder = lambda request: Reply(DEFAULT_TEXT)
        self._lock = threading.Lock()

    def add(self, *entries: Entry) -> None:
        with self._lock:
            self._queue.extend(entries)

    def respond_with(self, responder: Responder) -> None:
        self._responder = responder

    def next(self, request: Request) -> Reply:
        """The reply to `request`: the next queued one, else the responder's."""
        with self._lock:
            entry: Entry = self._queue.popleft() if self._queue else self._responder
        return entry if isinstance(entry, Reply) else entry(request)

    @property
    def pending(self) -> int:
        """Queued replies not yet sent."""
        return len(self._queue)
