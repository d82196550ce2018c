"""Round policies: each per-round behaviour of `call_model` is one small class.

A model round is a fold over the loop's policies, in the shape of LangChain's
agent middleware:

    before_model  each policy, in order, shapes the `Round` (view, tools, state
                  writes) or answers it itself (a blocked request, a quiet
                  group turn): then no model is called
    wrap_model_call  the call, wrapped by each policy, the first outermost
                  (fallback models, hidden thinking, no streaming)
    after_model   each policy, in order, vets and completes the `Reply`
                  (stable call ids, response guards, labels, closing results)

A policy says whether its hooks may block (`blocking`): an async round runs
its `before_model` and `after_model` folds on a worker thread only when one
of the policies that has such a hook blocks. A wrapper runs on the event loop;
it hands blocking work to the driver by yielding `nodes.kernel.steps.Work`.

The sync and async rounds share this code: `wrap_model_call` is a generator
that yields `Invoke` steps (and `Work`), which `nodes.kernel.steps.drive` runs in
place and `adrive` awaits. An exception a call raises comes back out of the
`yield from call(request)`, so a wrapper catches it as in plain code.

Example (a policy that logs how long the view is):

    class ViewSize(RoundPolicy):
        blocking = False

        def before_model(self, round: Round) -> None:
            log.info("round %d sends %d messages", round.number, len(round.view))

    LoopConfig(model=model, policies=[ViewSize()])
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.runtime import Runtime

from nodes.core.env import SessionEnv
from nodes.core.state import LoopState
from nodes.kernel.provider_errors import (
    acall_with_timeout,
    call_with_timeout,
    reading_reply,
    whole,
)
from nodes.kernel.steps import Step
from nodes.kernel.transcript import runnable_calls


@dataclass
class Round:
    """One model round of a turn, as the policies see it and shape it.

    Built fresh for each attempt of `call_model` (LangGraph retries the node
    on a transient error); nothing on it outlives the attempt except what a
    policy puts in `update`, written to state with the reply.
    """

    state: LoopState
    env: SessionEnv
    config: RunnableConfig
    persona_id: str | None
    """The persona answering (`Loop.persona_for`): the default one in restricted sessions."""
    number: int
    """1 for the turn's first model call, 2 after the first tool batch, …"""
    session_id: str | None
    attempt: int = 1
    """Which attempt of the node this is: side effects (events, hooks) belong to attempt 1."""
    final_attempt: bool = True
    """No retry of the node follows this attempt (fallback models are tried now, or never)."""
    writer: Callable[[Any], None] | None = None
    """The run's `stream_mode="custom"` writer, when the caller streams it."""
    runtime: Runtime[SessionEnv] | None = None
    """The node's runtime (LangChain middleware hooks take it)."""
    view: list[BaseMessage] = field(default_factory=list)
    """The messages the model is sent."""
    tools: list[BaseTool] = field(default_factory=list)
    """The tools the model is offered."""
    streamed: bool = True
    """Whether the reply's tokens may reach the caller as they come."""
    update: dict[str, Any] = field(default_factory=dict)
    """State written this round besides the reply (capacity, a refusal, …)."""
    answered: bool = False
    """A policy answered the round itself: no model is called, `update` is the node's write."""

    @property
    def messages(self) -> Sequence[BaseMessage]:
        """The transcript so far."""
        return self.state["messages"]

    @property
    def first_attempt(self) -> bool:
        return self.attempt == 1

    @property
    def label(self) -> str | None:
        """The `name` of the loop's replies: the persona id, except in restricted sessions
        (there, unlabelled already means the current persona)."""
        return None if self.env.restricted else self.persona_id

    def write(self, **update: Any) -> None:
        """Add to what the round writes to state; `messages` add up (removals, a refusal),
        the reply goes after them."""
        messages = [*self.update.get("messages", []), *update.pop("messages", [])]
        self.update.update(update, **({"messages": messages} if messages else {}))

    def answer(self, **update: Any) -> None:
        """End the round without calling the model; `update` is written to state."""
        self.write(**update)
        self.answered = True

    def emit(self, event: Mapping[str, Any]) -> None:
        """Send an event to the caller's `stream_mode="custom"` stream, if it listens."""
        if self.writer is not None:
            self.writer(dict(event))


@dataclass(frozen=True)
class ModelCall:
    """One call of a chat model: what is sent, to which model, and how."""

    model: BaseChatModel
    view: Sequence[BaseMessage]
    tools: Sequence[BaseTool]
    config: RunnableConfig
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Extra request parameters, bound on the model (e.g. the persona's thinking budget)."""
    tool_choice: Any = None
    """Which tool the model must call (`bind_tools(tool_choice=...)`); None: its choice."""
    timeout: float | None = None
    """Seconds the call may take (`LoopConfig.model_timeout`)."""
    runnable: Runnable[Any, BaseMessage] | None = None
    """What to invoke instead of the bound model (a wrapper around `bound()`)."""

    def override(self, **changes: Any) -> ModelCall:
        """A copy with `changes` (the request itself is never changed in place)."""
        return replace(self, **changes)

    def bound(self) -> Runnable[Any, BaseMessage]:
        """The model with this request's tools and settings."""
        bound: Runnable[Any, BaseMessage] = self.model
        if self.tools and self.tool_choice is not None:
            bound = self.model.bind_tools(list(self.tools), tool_choice=self.tool_choice)
        elif self.tools:
            bound = self.model.bind_tools(list(self.tools))
        return bound.bind(**self.settings) if self.settings else bound


@dataclass(frozen=True)
class Invoke:
    """The step that calls the model once, under the request's timeout."""

    request: ModelCall

    def run(self) -> BaseMessage:
        runnable, request = self.request.runnable or self.request.bound(), self.request
        with reading_reply():
            return whole(
                call_with_timeout(
                    lambda: runnable.invoke(list(request.view), request.config), request.timeout
                )
            )

    async def arun(self) -> BaseMessage:
        runnable, request = self.request.runnable or self.request.bound(), self.request
        with reading_reply():
            return whole(
                await acall_with_timeout(
                    lambda: runnable.ainvoke(list(request.view), request.config),
                    request.timeout,
                )
            )


CallSteps = Generator[Step, Any, BaseMessage]
"""A model call as steps: it yields `Invoke` (and `Work`), and returns the reply."""
CallModel = Callable[[ModelCall], CallSteps]


@dataclass
class Reply:
    """The model's reply as the after-model policies complete it."""

    message: AIMessage
    closing: list[ToolMessage] = field(default_factory=list)
    """Results the loop answers calls with instead of running them (written after the reply)."""
    follow: list[BaseMessage] = field(default_factory=list)
    """Messages written after those results (a middleware's closing word)."""

    def calls_to_run(self) -> list[ToolCall]:
        """The reply's calls that will run: runnable, and not answered by the loop."""
        closed = {result.tool_call_id for result in self.closing}
        return [c for c in runnable_calls(self.message) if c["id"] not in closed]

    def close(self, results: Sequence[ToolMessage]) -> None:
        """Answer calls with `results`; they will not run."""
        self.closing.extend(results)


class RoundPolicy:
    """One per-round behaviour of the loop. Override the hooks it needs.

    Attributes:
        blocking: whether `before_model` / `after_model` may block (I/O, a
            user's callback): an async round then runs that fold off the event
            loop. A policy is assumed to block unless it says otherwise.
    """

    blocking: bool = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def before_model(self, round: Round) -> None:
        """Shape the round before the model is called (or `round.answer(...)` it)."""

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        """Call the model through `call` (any number of times, or not at all)."""
        return (yield from call(request))

    def after_model(self, round: Round, reply: Reply) -> None:
        """Vet or complete the reply before it is stored."""

    def has(self, hook: str) -> bool:
        """Whether this policy overrides `hook` (the others are skipped in the folds)."""
        return getattr(type(self), hook) is not getattr(RoundPolicy, hook)


def hooks_block(policies: Sequence[RoundPolicy], hook: str) -> bool:
    """Whether a fold of `hook` over `policies` may block (decided once, at build time)."""
    return any(policy.blocking and policy.has(hook) for policy in policies)
