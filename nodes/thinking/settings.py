"""`Thinking`: the loop-wide thinking knobs, for personas that set none of their own.

A `Persona` may set each knob itself (`Persona(thinking_budget=2048)`); a knob
it leaves at `None` is taken from here (`knobs_for`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nodes.core.config import Persona
from nodes.core.feature import Feature
from nodes.thinking.knobs import Knobs


class Thinking(Feature):
    """How much the personas' models think, and whether the caller sees it.

    Example:
        >>> LoopConfig(model=model, features=[Thinking(reasoning_effort="low", show_thinking=False)])
    """

    thinking_budget: int | None = Field(
        default=None,
        ge=0,
        description="thinking tokens a reply may spend (Anthropic `budget_tokens`, Gemini `thinking_budget`), for personas that set none",
    )
    reasoning_effort: str | None = Field(
        default=None,
        description="how hard a reasoning model thinks (OpenAI `reasoning_effort`, Ollama `reasoning`), for personas that set none",
    )
    show_thinking: bool = Field(
        default=True,
        description="stream a reply's thinking to the caller, for personas that set nothing; `False` keeps it out of the stream, not the transcript",
    )
    model_accepts_thinking: bool | None = Field(
        default=None,
        description="whether the model takes the thinking knobs, for personas that set nothing; `None` reads its LangChain profile (`reasoning_output`: a model that does not reason is sent none, logged once; one without a profile is sent them), `True`/`False` decide for the persona's own model (fallbacks go by their profile)",
    )

    def knobs_for(self, persona: Persona | None) -> Knobs:
        """The persona's knobs, each it leaves unset taken from these settings."""

        def pick(name: str) -> Any:
            value = getattr(persona, name, None) if persona else None
            return getattr(self, name) if value is None else value

        return Knobs(
            pick("thinking_budget"),
            pick("reasoning_effort"),
            pick("show_thinking"),
            pick("model_accepts_thinking"),
        )
