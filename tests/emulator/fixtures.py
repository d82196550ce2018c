"""Pytest fixtures and client builders for the emulator.

A test module imports the fixtures it uses (the suite's conftest is not this
package's to change):

    from tests.emulator.fixtures import emulator, provider_env  # noqa: F401

`emulator` is a running `Emulator` for one test. `provider_env` also points
the OpenAI and Anthropic SDKs at it through their environment variables
(`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, keys `x`), as a user of
`model="openai:…"` strings would set them. `offline_tokenizer` (autouse where
imported) makes tiktoken's vocabulary download fail at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

from tests.emulator.server import Emulator

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
KEY = "x"
OVERRIDING = ("OPENAI_API_BASE", "ANTHROPIC_API_URL", "LANGSMITH_GATEWAY")
"""Variables the LangChain packages read before the base URLs the test sets."""


@contextmanager
def tiktoken_offline() -> Iterator[None]:
    """tiktoken's vocabulary download failing at once. This machine has no route to its host,
    and each attempt may wait out a 5 s DNS timeout; `ChatOpenAI`'s token counter (which
    compaction calls per message) tries again on every count."""

    def refuse(blobpath: str) -> bytes:
        raise ConnectionError(f"offline: {blobpath}")

    with mock.patch("tiktoken.load.read_file", refuse):
        yield


@pytest.fixture(autouse=True)
def offline_tokenizer() -> Iterator[None]:
    """`tiktoken_offline` for every test of a module that imports this fixture."""
    with tiktoken_offline():
        yield


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A running emulator, stopped (hangs ended) when the test ends."""
    with Emulator() as running:
        yield running


@pytest.fixture
def provider_env(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Emulator:
    """The emulator, with both SDKs' base URL and key variables pointing at it."""
    for name in OVERRIDING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", emulator.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", emulator.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    return emulator


def openai_model(emulator: Emulator, model: str = OPENAI_MODEL, **settings: Any) -> ChatOpenAI:
    """The real `ChatOpenAI`, talking to the emulator."""
    return ChatOpenAI(model=model, base_url=emulator.openai_url, api_key=KEY, **settings)


def anthropic_model(
    emulator: Emulator, model: str = ANTHROPIC_MODEL, **settings: Any
) -> ChatAnthropic:
    """The real `ChatAnthropic`, talking to the emulator."""
    return ChatAnthropic(model=model, base_url=emulator.url, api_key=KEY, **settings)


def client(emulator: Emulator, provider: str, **settings: Any) -> ChatOpenAI | ChatAnthropic:
    """The real client of `provider` ("openai" or "anthropic"), talking to the emulator."""
    build = {"openai": openai_model, "anthropic": anthropic_model}[provider]
    return build(emulator, **settings)
