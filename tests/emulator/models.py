"""The models the emulator serves, and which knobs each accepts.

A small table, matched by name prefix (so dated snapshots such as
`claude-sonnet-4-5-20250929` find their family); a model it does not hold
gets the provider's 404, as an unknown model does.

Sources:
- OpenAI `reasoning_effort` is for reasoning models only (the o-series and
  gpt-5, not `gpt-5-chat`); other models answer 400 `unsupported_parameter`
  (platform.openai.com/docs/guides/reasoning; the error as seen in
  lobehub/lobehub#8116 and Laisky/one-api#120).
- Anthropic extended thinking is for Claude 3.7 Sonnet and the Claude 4
  family, Haiku 4.5 included; Claude 3.5 models answer 400 "'<model>' does not
  support thinking." (docs.anthropic.com/en/docs/build-with-claude/
  extended-thinking; anthropics/claude-code#11388).
- Minimum cacheable prompt: 1,024 tokens, 2,048 on the Claude 3 Haiku models,
  4,096 on Haiku 4.5 (Anthropic's prompt-caching page, as quoted by
  docs.orq.ai/docs/proxy/prompt-caching).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """One model family: its name prefix and what it accepts."""

    prefix: str
    reasons: bool = False
    """OpenAI: takes `reasoning_effort`. Anthropic: takes `thinking`."""
    cache_minimum: int = 1024


OPENAI_MODELS = (
    Model("gpt-5-chat"),  # before "gpt-5": the chat model does not reason
    Model("gpt-5", reasons=True),
    Model("o1", reasons=True),
    Model("o3", reasons=True),
    Model("o4-mini", reasons=True),
    Model("gpt-4.1"),
    Model("gpt-4o"),  # gpt-4o-mini too
    Model("gpt-3.5-turbo"),
)
ANTHROPIC_MODELS = (
    Model("claude-3-5-haiku", cache_minimum=2048),
    Model("claude-3-haiku", cache_minimum=2048),
    Model("claude-3-5-sonnet"),
    Model("claude-3-7-sonnet", reasons=True),
    Model("claude-haiku-4-5", reasons=True, cache_minimum=4096),
    Model("claude-sonnet-4", reasons=True),  # 4 and 4.5
    Model("claude-opus-4", reasons=True),  # 4, 4.1 and 4.5
)


def lookup(table: tuple[Model, ...], name: str) -> Model | None:
    """The first family whose prefix `name` starts with (the table lists longer prefixes
    before the shorter ones they extend)."""
    return next((model for model in table if name.startswith(model.prefix)), None)
