"""What travels on the wire: a recorded request, an API error, a server-sent event."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ENDPOINTS = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",  # `ChatAnthropic.get_num_tokens_from_messages`
}
"""The endpoints the emulator serves, and whose API each is."""
GENERATING = frozenset({"/v1/chat/completions", "/v1/messages"})
"""The endpoints that generate a reply (the other one counts tokens)."""


@dataclass(repr=False)
class Request:
    """One HTTP request the emulator received, and how it was answered."""

    number: int
    """1 for the first request the emulator received, 2 for the next, …"""
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any
    """The parsed JSON body, or None when it was not JSON."""
    status: int | None = None
    error: str | None = None
    """The message of an error answer (a rule's 400, an injected fault's status)."""
    fault: str | None = None
    """The name of the fault injected into this request's answer."""
    usage: dict[str, Any] | None = None
    """The usage the answer reported."""

    def __repr__(self) -> str:
        """One line: a test's failure shows which request, not its whole body."""
        outcome = self.fault or self.error or ""
        return f"<request {self.number} {self.path} {self.status} {outcome[:80]!r}>"

    @property
    def provider(self) -> str | None:
        return ENDPOINTS.get(self.path)

    @property
    def generates(self) -> bool:
        """Whether this request asks for a reply (not a token count)."""
        return self.path in GENERATING

    @property
    def accepted(self) -> bool:
        return self.status == 200

    @property
    def payload(self) -> dict[str, Any]:
        """The body as a mapping ({} when it was not one)."""
        return self.body if isinstance(self.body, dict) else {}

    @property
    def model(self) -> str:
        return str(self.payload.get("model", ""))

    @property
    def stream(self) -> bool:
        return bool(self.payload.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.payload.get("messages") or [])


@dataclass
class ApiError(Exception):
    """An error answer in the provider's own shape (the dialect writes the body)."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


@dataclass(frozen=True)
class Frame:
    """One server-sent event, labelled with what it carries so faults can cut streams.

    `kind` is one of: start, ping, text, thinking, tool_start, tool_args,
    block_stop, stop (the finish reason), usage, done.
    """

    kind: str
    data: str
    event: str | None = None

    def encode(self) -> bytes:
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {self.data}\n\n".encode()


def event_frame(kind: str, payload: dict[str, Any], event: str | None = None) -> Frame:
    """A frame carrying `payload` as JSON."""
    return Frame(kind, json.dumps(payload, ensure_ascii=False), event)


def split(text: str, size: int = 6) -> list[str]:
    """`text` in stream-sized pieces."""
    return [text[i : i + size] for i in range(0, len(text), size)]
