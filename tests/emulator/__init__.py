"""A provider emulator for the tests: OpenAI Chat Completions and Anthropic Messages over
HTTP on 127.0.0.1, reached through the real LangChain clients (issue 32).

- `server.Emulator`: the server; scripted replies, every request recorded.
- `script`: `Reply`, `Call`, `call(...)`: what the emulated model answers.
- `openai_api`, `anthropic_api`, `anthropic_rules`: each API's rules (a broken
  request gets the provider's own 400) and the shape of its replies and streams.
- `tokens`: token estimates and both providers' prompt caching.
- `models`: which models exist and which knobs each takes.
- `faults`: error statuses, dropped connections, HTML bodies, hangs, cut or
  broken streams.
- `fixtures`: the `emulator` and `provider_env` fixtures, client builders.
- `traffic`: recorded requests back as LangChain views, for `tests/payload_checks.py`.
- `cache_share`: the cached share of input tokens over long chats (a benchmark's helper).
"""

from tests.emulator.faults import (
    BadSseLine,
    CutAfterToolName,
    CutStream,
    Drop,
    Hang,
    Html,
    Status,
)
from tests.emulator.script import Call, Reply, call
from tests.emulator.server import Emulator
from tests.emulator.wire import Request

__all__ = [
    "BadSseLine",
    "Call",
    "CutAfterToolName",
    "CutStream",
    "Drop",
    "Emulator",
    "Hang",
    "Html",
    "Reply",
    "Request",
    "Status",
    "call",
]
