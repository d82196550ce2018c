"""Faults a test injects into the emulator's answers.

Each fault acts at one of two points: before the answer (`intercept`: send an
error status, drop the connection, send HTML, or hang first), or on a streamed
answer's events (`edit`: cut it short, or slip in a broken line). A fault
applies to requests that generate a reply (not to token counts), and a stream
fault only to streamed ones, so "cut the next stream" waits for a stream.

Approximation: injected error statuses carry `retry-after-ms` (5 ms by
default), which both SDKs honour, so a test of retry counts does not wait
out the SDKs' backoff; real 5xx answers seldom carry it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tests.emulator.wire import Frame, Request

CONTENT = ("text", "thinking", "tool_args")
"""Frame kinds that carry a piece of the reply."""
GATEWAY_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
)


class Answer(Protocol):
    """What a fault can do to the HTTP exchange (the server's handler implements it)."""

    def send_status(self, status: int, retry_after: float) -> None: ...

    def send_raw(self, status: int, content_type: str, body: str) -> None: ...

    def drop(self) -> None: ...

    def pause(self, seconds: float) -> None: ...


class Fault:
    """Something that goes wrong with one answer; by default nothing does."""

    streams_only = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def applies(self, request: Request) -> bool:
        return request.generates and (request.stream or not self.streams_only)

    def intercept(self, answer: Answer) -> bool:
        """Act before the answer; True when the answer is then complete (nothing more is sent)."""
        return False

    def edit(self, frames: list[Frame]) -> list[Frame]:
        """The streamed answer's events, changed."""
        return frames


@dataclass(frozen=True)
class Status(Fault):
    """An error status in the provider's shape: 429, 500, 503, or Anthropic's 529."""

    status: int
    retry_after: float = 0.005

    def intercept(self, answer: Answer) -> bool:
        answer.send_status(self.status, self.retry_after)
        return True


class Drop(Fault):
    """The connection closes before any response is sent."""

    def intercept(self, answer: Answer) -> bool:
        answer.drop()
        return True


class Html(Fault):
    """A 200 whose body is a gateway's HTML page, not JSON (nor events)."""

    def intercept(self, answer: Answer) -> bool:
        answer.send_raw(200, "text/html; charset=utf-8", GATEWAY_PAGE)
        return True


@dataclass(frozen=True)
class Hang(Fault):
    """The server waits `seconds` (or until it stops) before it answers as usual, taking its
    reply from the script only then (a client that gave up never sees it)."""

    seconds: float

    def intercept(self, answer: Answer) -> bool:
        answer.pause(self.seconds)
        return False


class CutStream(Fault):
    """The stream ends after the reply's content, before its finish reason: no
    `finish_reason` chunk (nor usage, nor `[DONE]`), no `message_delta` / `message_stop`."""

    streams_only = True

    def edit(self, frames: list[Frame]) -> list[Frame]:
        end = next(i for i, frame in enumerate(frames) if frame.kind == "stop")
        return frames[:end]


class CutAfterToolName(Fault):
    """The stream ends right after the first tool call's id and name: no arguments."""

    streams_only = True

    def edit(self, frames: list[Frame]) -> list[Frame]:
        start = next(i for i, frame in enumerate(frames) if frame.kind == "tool_start")
        return frames[: start + 1]


class BadSseLine(Fault):
    """One event mid-stream whose JSON is cut in half (the rest of the stream follows)."""

    streams_only = True

    def edit(self, frames: list[Frame]) -> list[Frame]:
        at = next((i for i, frame in enumerate(frames) if frame.kind in CONTENT), 1)
        broken = Frame("broken", frames[at].data[: len(frames[at].data) // 2], frames[at].event)
        return [*frames[:at], broken, *frames[at:]]
