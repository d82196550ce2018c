"""The emulator: OpenAI Chat Completions and Anthropic Messages on 127.0.0.1.

    with Emulator() as api:
        api.reply(Reply("你好"), call("get_time"))
        model = ChatOpenAI(base_url=api.openai_url, api_key="x", model="gpt-4o-mini")

It answers from the test's script (`tests.emulator.script`), refuses what the
real APIs refuse (`openai_api`, `anthropic_rules`), reports usage and cached
tokens as they do (`tokens`), and injects the test's faults (`faults`). Every
HTTP request is recorded on arrival, before any fault, so `api.requests`
counts what reached the wire. A plain `ThreadingHTTPServer`: it starts in
milliseconds, and a hang in one request never holds up another.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count as counter
from typing import Any, Protocol

from tests.emulator.anthropic_api import AnthropicDialect
from tests.emulator.faults import Fault
from tests.emulator.openai_api import OpenAIDialect
from tests.emulator.script import Entry, Reply, Responder, Script
from tests.emulator.wire import ENDPOINTS, ApiError, Frame, Request

Predicate = Callable[[Request], bool]


class Dialect(Protocol):
    """One provider's API: its rules, its answers, its error shapes."""

    def check(self, request: Request) -> None: ...

    def answer(self, request: Request, reply: Reply | None) -> dict[str, Any] | list[Frame]: ...

    def error_body(self, error: ApiError) -> dict[str, Any]: ...

    def status_error(self, status: int) -> ApiError: ...


@dataclass
class Injection:
    """A fault for the next `remaining` requests it applies to (None: every one) that
    `when` accepts."""

    fault: Fault
    remaining: int | None
    when: Predicate | None

    def takes(self, request: Request) -> bool:
        wanted = self.when is None or self.when(request)
        return self.remaining != 0 and self.fault.applies(request) and wanted


class Emulator:
    """A scripted, rule-enforcing provider API for tests; a context manager."""

    def __init__(self) -> None:
        ids = counter(1)
        self.openai, self.anthropic = OpenAIDialect(ids), AnthropicDialect(ids)
        by_provider: dict[str, Dialect] = {"openai": self.openai, "anthropic": self.anthropic}
        self.dialects = {path: by_provider[provider] for path, provider in ENDPOINTS.items()}
        self.script = Script()
        self.requests: list[Request] = []
        self.stopping = threading.Event()
        self._injections: list[Injection] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), daemon=True
        )

    @property
    def url(self) -> str:
        """The base URL for Anthropic clients (`ANTHROPIC_BASE_URL`)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_url(self) -> str:
        """The base URL for OpenAI clients (`OPENAI_BASE_URL`)."""
        return f"{self.url}/v1"

    def __enter__(self) -> Emulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()  # ends every hang
        self._server.shutdown()
        self._server.server_close()

    # -- what the test sets ---------------------------------------------
    def reply(self, *entries: Entry) -> None:
        """Queue replies (or functions of the request returning one)."""
        self.script.add(*entries)

    def respond_with(self, responder: Responder) -> None:
        """Answer every request after the queue with `responder(request)`."""
        self.script.respond_with(responder)

    def inject(self, fault: Fault, times: int | None = 1, when: Predicate | None = None) -> None:
        """Inject `fault` into the next `times` answers it applies to (None: all of them)."""
        with self._lock:
            self._injections.append(Injection(fault, times, when))

    # -- what the test reads ---------------------------------------------
    def generations(self, provider: str | None = None) -> list[Request]:
        """Every request for a reply (of one provider), in arrival order."""
        return [r for r in self.requests if r.generates and provider in (None, r.provider)]

    def rejected(self) -> list[Request]:
        """The requests a rule refused (4xx), with the API's message in `error`."""
        return [r for r in self.requests if r.fault is None and (r.status or 0) >= 400]

    # -- what the handler calls -------------------------------------------
    def record(self, path: str, headers: dict[str, str], body: Any) -> Request:
        with self._lock:
            request = Request(len(self.requests) + 1, path, headers, body)
            self.requests.append(request)
            return request

    def take_fault(self, request: Request) -> Fault | None:
        with self._lock:
            injection = next((i for i in self._injections if i.takes(request)), None)
            if injection is None:
                return None
            if injection.remaining is not None:
                injection.remaining -= 1
            request.fault = injection.fault.name
            return injection.fault

    def serve(self, request: Request, dialect: Dialect) -> dict[str, Any] | list[Frame]:
        """The answer to a request that passed every fault: checked, then answered."""
        dialect.check(request)
        reply = self.script.next(request) if request.generates else None
        with self._lock:  # the caches are shared by every request
            return dialect.answer(request, reply)


def handler_for(emulator: Emulator) -> type[BaseHTTPRequestHandler]:
    """The request handler class, bound to `emulator`."""

    class Handler(ExchangeHandler):
        api = emulator

    return Handler


class ExchangeHandler(BaseHTTPRequestHandler):
    """One HTTP exchange: record, fault, check, answer (JSON, or events, chunked)."""

    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the SDKs expect
    disable_nagle_algorithm = True  # small writes go out at once (no 40 ms delayed-ACK stalls)
    api: Emulator
    dialect: Dialect
    record: Request

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads `api.requests` instead."""

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.record = self.api.record(self.path, headers, parsed(raw))
        dialect = self.api.dialects.get(self.path)
        if dialect is None:
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})
        else:
            self.dialect = dialect
            self.exchange(self.api.take_fault(self.record) or Fault())

    def exchange(self, fault: Fault) -> None:
        """The answer to the recorded request, as `fault` leaves it."""
        if fault.intercept(self):
            return
        try:
            answer = self.api.serve(self.record, self.dialect)
        except ApiError as error:
            self.send_error_answer(error)
            return
        if isinstance(answer, list):
            self.send_events(fault.edit(answer))
        else:
            self.send_json(200, answer)

    # -- the fault's side (`faults.Answer`) -------------------------------
    def send_status(self, status: int, retry_after: float) -> None:
        error = self.dialect.status_error(status)
        error.headers = {
            "retry-after-ms": str(max(1, round(retry_after * 1000))),
            "retry-after": str(math.ceil(retry_after)),
        }
        self.send_error_answer(error)

    def send_raw(self, status: int, content_type: str, body: str) -> None:
        self.record.status = status
        self.write_head(status, {"content-type": content_type}, len(body.encode()))
        self.write(body.encode())

    def drop(self) -> None:
        self.close_connection = True  # the server closes the socket without a response

    def pause(self, seconds: float) -> None:
        self.api.stopping.wait(seconds)

    # -- answers ----------------------------------------------------------
    def send_error_answer(self, error: ApiError) -> None:
        self.record.error = error.message
        # Anthropic marks a 4xx this way (lobehub/lobehub#1496); both SDKs honour the header
        retry = {"x-should-retry": "false"} if error.status < 500 and error.status != 429 else {}
        self.send_json(error.status, self.dialect.error_body(error), {**retry, **error.headers})

    def send_json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self.record.status = status
        data = json.dumps(body, ensure_ascii=False).encode()
        self.write_head(status, {"content-type": "application/json", **(headers or {})}, len(data))
        self.write(data)

    def send_events(self, frames: list[Frame]) -> None:
        self.record.status = 200
        self.write_head(200, {"content-type": "text/event-stream", "transfer-encoding": "chunked"})
        for frame in frames:
            data = frame.encode()
            self.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.write(b"0\r\n\r\n")

    def write_head(self, status: int, headers: dict[str, str], length: int | None = None) -> None:
        self.send_response(status)
        for name, value in {**headers, "request-id": f"req_{self.record.number}"}.items():
            self.send_header(name, value)
        if length is not None:
            self.send_header("content-length", str(length))
        self.end_headers()

    def write(self, data: bytes) -> None:
        """Write, unless the client has gone (it timed out during a hang)."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def parsed(raw: bytes) -> Any:
    """The request body as JSON, or None."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
