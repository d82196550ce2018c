"""Every private or Beta API of LangGraph and LangChain that the loop relies on.

Nothing else in the project reaches into `langgraph._internal` or calls an
underscore method of a dependency: when an upgrade moves one of these, this
file and `tests/test_compat.py` are the only places that change, and that
test names what moved. `pyproject.toml` pins `langgraph` to the minor versions
the tests cover for the same reason (`DeltaChannel` is Beta).
"""

from __future__ import annotations

from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langgraph._internal._constants import CONFIG_KEY_DURABILITY
from langgraph._internal._runnable import RunnableCallable
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.state import CompiledStateGraph

__all__ = [
    "CONFIG_KEY_DURABILITY",
    "DeltaChannel",
    "RunnableCallable",
    "chat_model_provider",
    "reclass_compiled",
]

CompiledT = TypeVar("CompiledT", bound=CompiledStateGraph)


def reclass_compiled(
    compiled: CompiledStateGraph, cls: type[CompiledT], **extra: Any
) -> CompiledT:
    """`compiled` re-made as an instance of the subclass `cls`, with `extra` init arguments.

    `CompiledStateGraph.copy` does the same inside LangGraph: a compiled graph
    is rebuilt from its attributes (`__orig_class__` is typing's, not an init
    argument).
    """
    attrs = {k: v for k, v in compiled.__dict__.items() if k != "__orig_class__"}
    return cls(**attrs, **extra)


def chat_model_provider(model: BaseChatModel) -> str:
    """The provider LangChain reports for tracing (`ls_provider`), else the model's `_llm_type`.

    `_get_ls_params` is the only place LangChain says which provider a chat
    model talks to ("openai", "anthropic", …) without a live client.
    """
    try:
        name = str(model._get_ls_params().get("ls_provider") or "")
    except Exception:  # a model whose params need a live client, say
        name = ""
    return name or model._llm_type
