"""One attempt of `call_model`: the persona's model, then its fallbacks, each under a timeout.

Retries belong to LangGraph: `call_model` carries a `RetryPolicy` that re-runs
the node, with backoff and jitter, while the persona's model raises transient
errors. Within one attempt of the node:

    persona's model ── transient error, attempts left ──▶ raise: LangGraph waits and retries
          │ any other error, or the last attempt
          ▼
    fallback 1, fallback 2, … (once each, at once: another deployment needs no wait)
          │ all failed
          ▼
    raise the persona's model's own exception, with a note naming what else failed

So the sequence is: persona's model with retries → fallback 1 → … → the caller
gets the first model's exception (its own type, e.g. `openai.RateLimitError`),
and the session stays at `call_model`, resumable with `invoke(None, thread)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime

from nodes.provider_errors import acall_with_timeout, call_with_timeout, is_transient


@dataclass
class ModelCall:
    """One model to call: what to invoke, with which view and config, and how its result
    becomes the transcript's reply."""

    runnable: Runnable
    view: Sequence[BaseMessage]
    config: RunnableConfig
    to_reply: Callable[[BaseMessage], BaseMessage]
    timeout: float | None = None

    def invoke(self) -> BaseMessage:
        result = call_with_timeout(
            lambda: self.runnable.invoke(self.view, self.config), self.timeout
        )
        return self.to_reply(result)

    async def ainvoke(self) -> BaseMessage:
        result = await acall_with_timeout(
            lambda: self.runnable.ainvoke(self.view, self.config), self.timeout
        )
        return self.to_reply(result)


def node_attempt(runtime: Runtime[Any] | None) -> int | None:
    """Which execution of the node this is (1 on the first run, 2 on the first retry, …),
    or None outside LangGraph's runner."""
    info = getattr(runtime, "execution_info", None)
    return info.node_attempt if info is not None else None


@dataclass
class ModelAttempts:
    """The calls of one node attempt, and what to do when one fails.

    `calls` yields the persona's model first, then the fallbacks (built lazily:
    binding tools and, for another provider family, re-assembling the view
    costs only when needed). `final` is true on the node's last attempt.
    """

    calls: Iterator[ModelCall]
    attempt: int
    final: bool
    errors: list[BaseException] = field(default_factory=list)

    def next_call(self) -> ModelCall | None:
        return next(self.calls, None)

    def failed(self, exc: BaseException) -> bool:
        """Record a failed call; True when the exception must propagate now: an interrupt,
        or a transient error of the persona's model while LangGraph has retries left."""
        self.errors.append(exc)
        if isinstance(exc, GraphBubbleUp):
            return True
        return len(self.errors) == 1 and not self.final and is_transient(exc)

    def give_up(self) -> BaseException:
        """The persona's model's exception, noting the attempts and what the fallbacks raised."""
        primary, *fallbacks = self.errors
        primary.add_note(
            f"call_model gave up on attempt {self.attempt} of the persona's model"
            + (f" and {len(fallbacks)} fallback model(s)" if fallbacks else "")
            + "; with a checkpointer the turn is saved at call_model, and "
            "invoke(None, <same thread>) resumes it."
        )
        for index, exc in enumerate(fallbacks, start=1):
            primary.add_note(f"fallback {index} failed: {type(exc).__name__}: {exc}")
        return primary
