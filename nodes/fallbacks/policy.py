"""Fallback models: when the persona's model fails for good, the next model is tried at once.

Retries belong to LangGraph: `call_model` carries a `RetryPolicy`
(`LoopConfig.retry`) that re-runs the node, with backoff and jitter, while the
persona's model raises errors it retries. Within one attempt of the node:

    persona's model ── retryable error, attempts left ──▶ raise: LangGraph waits and retries
          │ any other error, or the last attempt
          ▼
    fallback 1, fallback 2, … (once each, at once: another deployment needs no wait)
          │ all failed
          ▼
    raise the persona's model's own exception, with a note naming what else failed

So the caller gets the first model's exception (its own type, e.g.
`openai.RateLimitError`), and the session stays at `call_model`, resumable
with `invoke(None, thread)`, unless the provider refused the request itself (a
400, say): then the note says what to change instead of promising a resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langgraph.errors import GraphBubbleUp

from nodes.context.assemble import view_blocks, view_of_state
from nodes.context.settings import ModelView
from nodes.core.loop import answering_model
from nodes.core.policy import CallModel, CallSteps, ModelCall, Round, RoundPolicy
from nodes.core.stages import Stages
from nodes.fallbacks.settings import Fallbacks
from nodes.kernel.provider_errors import refused_status, retries_on
from nodes.kernel.steps import Work

if TYPE_CHECKING:
    from nodes.core.loop import Loop


class FallbackModels(RoundPolicy):
    """Around the model call, outermost: the persona's model, then each fallback model.

    With no fallback models it still names, on the exception the caller gets,
    the attempt it gave up on and how to resume.
    """

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        return [cls(loop)]

    blocking = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.models = tuple(
            answering_model(model, f"Fallbacks.models[{index}]", loop.config)
            for index, model in enumerate(loop.feature(Fallbacks).models)
        )
        self.retry = loop.config.retry
        self.view_blocks = view_blocks(loop)

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        try:
            return (yield from call(request))
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if not round.final_attempt and retries_on(self.retry, exc):
                raise  # LangGraph waits and runs the node again
            errors: list[Exception] = [exc]
        for model in self.models:
            view = yield Work(self.view_for, (round, request.view, model), self.view_blocks)
            try:
                return (yield from call(request.override(model=model, view=view)))
            except GraphBubbleUp:
                raise
            except Exception as exc:
                errors.append(exc)
        raise gave_up(round.attempt, errors)

    def view_for(
        self, round: Round, view: Sequence[BaseMessage], model: BaseChatModel
    ) -> Sequence[BaseMessage]:
        """The round's view as `model` must be sent it: assembled again when its provider
        needs another attribution encoding or name handling than the persona's model."""
        fallback = replace(self.loop, default_model=model, persona_models={})

        def shape(of: Loop) -> tuple[Any, bool]:
            provider = of.provider_for(round.persona_id)
            return of.feature(ModelView).encoding_for(provider), provider == "openai"

        if shape(fallback) == shape(self.loop):
            return view
        return view_of_state(fallback, round.env, round.state, config=round.config)


def gave_up(attempt: int, errors: list[Exception]) -> Exception:
    """The persona's model's exception, noting the attempt, what the fallbacks raised, and
    whether resuming can help (not when the provider refused the request itself)."""
    primary, *fallbacks = errors
    gave_up_on = f"call_model gave up on attempt {attempt} of the persona's model" + (
        f" and {len(fallbacks)} fallback model(s)" if fallbacks else ""
    )
    if (status := refused_status(primary)) is not None:
        primary.add_note(
            f"{gave_up_on}: the provider refused the request (HTTP {status}), and sent again "
            "as it is it would be refused again, so change what the error names (the model, "
            "its key, a setting) first. With a checkpointer the user's message is saved, and "
            "the session's next turn sees it."
        )
    else:
        primary.add_note(
            f"{gave_up_on}; with a checkpointer the turn is saved at call_model, and "
            "invoke(None, <same thread>) resumes it."
        )
    for index, exc in enumerate(fallbacks, start=1):
        primary.add_note(f"fallback {index} failed: {type(exc).__name__}: {exc}")
    return primary
