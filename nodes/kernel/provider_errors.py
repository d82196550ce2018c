"""Which model-call failures are worth retrying, the retry policy, and a per-call timeout.

`call_model` carries LangGraph's `RetryPolicy` (`LoopConfig.retry`); unless the
caller says otherwise it retries what `is_transient` recognises, and each
model call runs under `call_with_timeout` / `acall_with_timeout`, with a 200 that
holds no whole reply raised as `MalformedReply` (`reading_reply`, `whole`). The
provider SDKs are optional for users, so their exceptions are recognised by module
and attributes, never by importing them.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from langchain_core.exceptions import ModelAPIError, ModelError, ModelTimeoutError
from langchain_core.messages import BaseMessage
from langgraph.types import RetryPolicy, default_retry_on

from nodes.kernel.compat import retry_policy_retries
from nodes.kernel.replies import ended_unsaid

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 409, 429})
"""HTTP statuses the OpenAI and Anthropic SDKs themselves retry, besides every 5xx (529 included)."""
SDK_PACKAGES = frozenset({"openai", "anthropic", "httpx", "httpx2", "httpcore"})
TRANSIENT_SDK_ERRORS = frozenset(
    {
        "APIConnectionError",  # openai / anthropic, APITimeoutError included
        "TimeoutException",  # httpx: connect, read, write and pool timeouts
        "NetworkError",  # httpx: ConnectError, ReadError, WriteError, CloseError
        "RemoteProtocolError",  # httpx: the server hung up mid-response
    }
)


class ModelCallTimeout(ModelTimeoutError, TimeoutError):
    """A model call took longer than `LoopConfig.model_timeout`; transient, so it is retried."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the model did not answer within model_timeout={seconds} seconds")
        self.seconds = seconds


class MalformedReply(ModelAPIError):
    """The provider answered 200 with something that is no whole reply (a gateway's HTML
    page, a stream event cut in half, a stream without events, a stream that broke off
    before it said why the reply stopped); transient, like a 5xx, so it is retried, and
    nothing of it is kept."""


NO_STREAM_EVENTS = ("No generation chunks were returned", "No generations found in stream.")
"""LangChain's `ValueError`s for a stream that held no event it could read (`invoke` on a
streaming model, and `stream`, word it differently)."""
TEXT_BODY = "Unexpected response type from OpenAI-compatible endpoint"
"""langchain-openai's `ValueError` for a body the SDK handed over as text (not JSON)."""


def _malformed(exc: BaseException) -> bool:
    """Whether `exc` says the answer was no reply: a body or stream event that is not JSON,
    a stream without events, or a text body where the SDK's reply object was expected
    (langchain-openai names it; langchain-anthropic calls `model_dump` on the text)."""
    if isinstance(exc, json.JSONDecodeError):
        return True
    if isinstance(exc, ValueError):
        return str(exc) in NO_STREAM_EVENTS or str(exc).startswith(TEXT_BODY)
    return isinstance(exc, AttributeError) and isinstance(exc.obj, str) and exc.name == "model_dump"


@contextmanager
def reading_reply() -> Iterator[None]:
    """Around a model call: a malformed answer is raised as `MalformedReply`."""
    try:
        yield
    except Exception as exc:
        if _malformed(exc):
            raise MalformedReply(
                f"the provider's answer is not a reply ({type(exc).__name__}: {exc})"
            ) from exc
        raise


def whole(reply: BaseMessage) -> BaseMessage:
    """`reply`, unless it is a stream that broke off (`MalformedReply`): its text may stop
    mid-sentence and its last call's arguments be missing."""
    if ended_unsaid(reply):
        raise MalformedReply(
            "the provider's stream ended before it said why the reply stopped (no finish or "
            "stop reason): it was cut off"
        )
    return reply


def is_transient(exc: BaseException) -> bool:
    """Whether the same request may succeed if sent again: rate limits, 5xx, timeouts,
    dropped connections. Client errors (400, 401, 404, …) and bugs are not.

    An exception raised `from` a transient one (a wrapper around an SDK error)
    counts as transient too.
    """
    return any(_transient_itself(link) for link in _causes(exc))


def refused_status(exc: BaseException) -> int | None:
    """The HTTP status with which the provider refused the request itself (400, 401, 403,
    404, 422, …: a 4xx but the transient 408, 409 and 429), or None. Sent again as it is,
    such a request is refused again: only a change (the model, its key, a setting) helps."""
    for link in _causes(exc):
        status = _status_code(link)
        if status is not None and 400 <= status < 500 and status not in TRANSIENT_STATUS:
            return status
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised `from`, and so on (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def _transient_itself(exc: BaseException) -> bool:
    if isinstance(exc, ModelError):  # LangChain's own mapping of provider errors is authoritative
        return exc.is_retryable
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = _status_code(exc)
    if status is not None:
        return status in TRANSIENT_STATUS or status >= 500
    return any(
        cls.__name__ in TRANSIENT_SDK_ERRORS and cls.__module__.split(".")[0] in SDK_PACKAGES
        for cls in type(exc).__mro__
    )


def _status_code(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (`.status_code`, or httpx's `.response.status_code`)."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int):
            return status
    return None


DEFAULT_RETRY: dict[str, Any] = {
    "max_attempts": 3,
    "initial_interval": 0.5,
    "backoff_factor": 2.0,
    "max_interval": 30.0,
    "jitter": True,
}
"""`LoopConfig.retry`'s default: two retries, 0.5 s then 1 s (plus up to 1 s of jitter)."""


def retry_policy(value: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy | None:
    """LangGraph's `RetryPolicy` from a policy, a mapping of its arguments, or None (off).

    A mapping fills in `DEFAULT_RETRY`. Where `retry_on` is LangGraph's own
    default (which knows nothing of provider SDKs), it becomes `is_transient`.

    Raises:
        ValueError: a value that is none of those, an argument `RetryPolicy` lacks,
            or `max_attempts` below 1.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(RetryPolicy._fields))
        if unknown:
            raise ValueError(
                f"retry: unknown argument(s) {unknown}; RetryPolicy takes {list(RetryPolicy._fields)}"
            )
        value = RetryPolicy(**{**DEFAULT_RETRY, **value})
    if not isinstance(value, RetryPolicy):
        raise ValueError(
            f"retry: expected a RetryPolicy, a mapping of its arguments or None, got {type(value).__name__}"
        )
    if value.max_attempts < 1:
        raise ValueError(f"retry: max_attempts must be at least 1, got {value.max_attempts}")
    if value.retry_on is default_retry_on:
        value = value._replace(retry_on=is_transient)
    return value


def retries_on(policy: RetryPolicy | None, exc: Exception) -> bool:
    """Whether `policy` retries after `exc` (never without a policy)."""
    return policy is not None and policy.max_attempts > 1 and retry_policy_retries(policy, exc)


def call_with_timeout(call: Callable[[], T], seconds: float | None) -> T:
    """`call()`, or `ModelCallTimeout` once `seconds` pass.

    A blocking call cannot be interrupted, so it runs in a daemon thread (with
    the caller's context, which carries LangChain's callbacks) and is
    abandoned on timeout: its eventual result is dropped.
    """
    if seconds is None:
        return call()
    future: Future[T] = Future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            future.set_result(context.run(call))
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)

    threading.Thread(target=run, name="cyrene-model-call", daemon=True).start()
    try:
        return future.result(timeout=seconds)
    except TimeoutError:
        if future.done():  # the call itself raised a TimeoutError
            raise
        raise ModelCallTimeout(seconds) from None


async def acall_with_timeout(call: Callable[[], Awaitable[T]], seconds: float | None) -> T:
    """`await call()`, cancelled with `ModelCallTimeout` once `seconds` pass."""
    if seconds is None:
        return await call()
    try:
        async with asyncio.timeout(seconds) as scope:
            return await call()
    except TimeoutError:
        if scope.expired():
            raise ModelCallTimeout(seconds) from None
        raise
