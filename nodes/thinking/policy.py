"""Keep a model's thinking out of the user's stream while the transcript keeps it.

LangGraph's `stream_mode="messages"` forwards every chunk a chat model yields.
`ThinkingGate` wraps the real model: the real model runs untagged for
streaming (`nostream`), and the gate yields each chunk with its reasoning
removed, so the stream carries the reply text in real time but no thinking.
The complete message, thinking included, is captured for the transcript.

`ThinkingKnobs` is the round policy: it sends each persona's thinking knobs
(budget, effort) in the spelling of the provider called, to a model that takes
them (`nodes.thinking.knobs`), and puts the gate around the call when the
persona's thinking is not shown.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
)
from langchain_core.callbacks.manager import BaseRunManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage, message_chunk_to_message
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.constants import TAG_NOSTREAM
from pydantic import Field

from nodes.core.policy import CallModel, CallSteps, ModelCall, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.kernel.chat_model import Kwargs, Messages, ReplyChatModel, RunManager
from nodes.kernel.compat import chat_model_name
from nodes.thinking.knobs import (
    Knobs,
    continues_round_without_thinking,
    profile_reasons,
    request_kwargs,
    without_reasoning,
)
from nodes.thinking.settings import Thinking

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.thinking")


def _inner_config(run_manager: BaseRunManager | None) -> RunnableConfig:
    """The inner model runs as a child of the gate's run, untagged for streaming.

    An LLM run manager has no `get_child` (only chains do), so the child
    manager is built the way `ParentRunManager.get_child` builds one.
    """
    if run_manager is None:
        return {"tags": [TAG_NOSTREAM]}
    child_class = (
        AsyncCallbackManager
        if isinstance(run_manager, AsyncCallbackManagerForLLMRun)
        else CallbackManager
    )
    child = child_class(handlers=[], parent_run_id=run_manager.run_id)
    child.set_handlers(run_manager.inheritable_handlers)
    child.add_tags(run_manager.inheritable_tags)
    child.add_metadata(run_manager.inheritable_metadata)
    return {"callbacks": child, "tags": [TAG_NOSTREAM]}


class ThinkingGate(ReplyChatModel):
    """A one-shot wrapper: stream the inner model's reply without its reasoning."""

    inner: Runnable[Any, BaseMessage]
    captured: list[BaseMessage] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "cyrene-thinking-gate"

    def reply(self, messages: Messages, run_manager: RunManager, kwargs: Kwargs) -> BaseMessage:
        full = self.inner.invoke(messages, _inner_config(run_manager))
        self.captured.append(full)
        return without_reasoning(full)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        full = await self.inner.ainvoke(messages, _inner_config(run_manager))
        self.captured.append(full)
        return ChatResult(generations=[ChatGeneration(message=without_reasoning(full))])

    def stream_reply(
        self, messages: Messages, run_manager: RunManager, kwargs: Kwargs
    ) -> Iterator[AIMessageChunk]:
        full: AIMessageChunk | None = None
        for chunk in self.inner.stream(messages, _inner_config(run_manager)):
            piece = cast(AIMessageChunk, chunk)  # a chat model streams chunks
            full = piece if full is None else full + piece
            yield without_reasoning(piece)
        self._capture_stream(full)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        full: AIMessageChunk | None = None
        async for chunk in self.inner.astream(messages, _inner_config(run_manager)):
            piece = cast(AIMessageChunk, chunk)  # a chat model streams chunks
            full = piece if full is None else full + piece
            yield ChatGenerationChunk(message=without_reasoning(piece))
        self._capture_stream(full)

    def _capture_stream(self, full: AIMessageChunk | None) -> None:
        if full is not None:
            self.captured.append(message_chunk_to_message(full))

    def transcript_message(self, visible: BaseMessage) -> BaseMessage:
        """The full reply (with thinking) under the id the stream used."""
        full = self.captured[-1] if self.captured else visible
        return full.model_copy(update={"id": visible.id})


class ThinkingKnobs(RoundPolicy):
    """Around each model call: the persona's thinking budget and reasoning effort in the
    called provider's spelling (a fallback of another family gets its own), to a model
    that takes them, and the `ThinkingGate` when the persona's thinking must not reach
    the stream."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop)]

    blocking = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.settings = loop.feature(Thinking)
        self.dropped: set[tuple[str, str]] = set()
        """The (model, knob) pairs already logged as dropped: each is logged once per graph."""

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        knobs = self.settings.knobs_for(self.loop.persona(round.persona_id))
        family = self.loop.family(request.model)
        settings = request_kwargs(family, knobs)
        if family == "anthropic" and continues_round_without_thinking(request.view):
            settings = {}  # Anthropic's advice: thinking off until the round is over
        if settings and self.takes_knobs(request.model, round.persona_id, knobs):
            request = request.override(settings={**request.settings, **settings})
        elif settings:
            self.log_dropped(request.model, settings)
        if knobs.show_thinking or not round.streamed:
            return (yield from call(request))
        gate = ThinkingGate(inner=request.runnable or request.bound())
        visible = yield from call(request.override(runnable=gate))
        return gate.transcript_message(visible)

    def takes_knobs(self, model: BaseChatModel, persona_id: str | None, knobs: Knobs) -> bool:
        """The persona's `model_accepts_thinking` for its own model, else the model's
        profile; a model that has none is sent the knobs (it may be any gateway's)."""
        own = model is self.loop.model_for(persona_id)
        accepts = knobs.model_accepts_thinking if own else None
        return (profile_reasons(model) if accepts is None else accepts) is not False

    def log_dropped(self, model: BaseChatModel, settings: dict[str, Any]) -> None:
        name = chat_model_name(model)
        for knob in settings:
            if (name, knob) not in self.dropped:
                self.dropped.add((name, knob))
                log.warning(
                    "not sending %s to %s: it takes no thinking knobs (model_accepts_thinking, "
                    "else its LangChain profile's reasoning_output); model_accepts_thinking=True "
                    "sends them anyway",
                    knob,
                    name,
                )
