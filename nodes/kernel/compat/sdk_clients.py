"""The provider SDK clients inside LangChain's OpenAI and Anthropic chat models, set up for
`call_model`.

LangGraph's `RetryPolicy` on `call_model` is the loop's only retry: the OpenAI and
Anthropic SDKs also retry twice by themselves, so under the policy's 3 attempts one
persistent 500 cost 9 requests, and `retry={"max_attempts": 1}` still sent 3. Their
LangChain models send no timeout either (`timeout=None`: none at all), so a call that
`model_timeout` abandoned kept its thread and connection for as long as the server
pleased. Both SDK clients are built with the model (`ChatOpenAI`: fields; `ChatAnthropic`:
cached properties), so a copy of the model gets clients of its own.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from langchain_core.language_models import BaseChatModel

OPENAI_SDK_CLIENTS = (("root_client", "client"), ("root_async_client", "async_client"))
"""`BaseChatOpenAI`'s SDK clients and the `chat.completions` resource each hands out."""
ANTHROPIC_SDK_CACHES = ("_client_params", "_client", "_async_client")
"""`ChatAnthropic`'s cached properties, rebuilt from its fields on first use."""
TIMEOUT_FIELDS = ("request_timeout", "default_request_timeout")
"""The SDK timeout's field: `BaseChatOpenAI`'s, `ChatAnthropic`'s (both aliased `timeout`)."""


def _holds_sdk_clients(model: BaseChatModel) -> bool:
    """Whether `model` is shaped like one of the two models this module knows."""
    if hasattr(model, OPENAI_SDK_CLIENTS[0][0]):
        return True
    return isinstance(getattr(type(model), "_client", None), cached_property)


def single_attempt(model: BaseChatModel, timeout: float | None) -> BaseChatModel:
    """A copy of `model` whose SDK makes one attempt per call (`max_retries=0`) and, when
    the model sets no timeout of its own, gives up after `timeout` seconds.

    `model` itself when its caller set `max_retries` (their choice stands), or when it
    holds no SDK client of a shape known here.
    """
    if "max_retries" in model.model_fields_set or not _holds_sdk_clients(model):
        return model
    update: dict[str, Any] = {"max_retries": 0}
    options: dict[str, Any] = {"max_retries": 0}
    timeout_field = next(
        (name for name in TIMEOUT_FIELDS if name in type(model).model_fields), None
    )
    if timeout is not None and timeout_field and getattr(model, timeout_field) is None:
        update[timeout_field] = options["timeout"] = timeout
    for root, resource in OPENAI_SDK_CLIENTS:
        if (sdk := getattr(model, root, None)) is not None:
            update[root] = sdk = sdk.with_options(**options)  # shares the HTTP connection pool
            update[resource] = sdk.chat.completions
    copy = model.model_copy(update=update)
    for cached in ANTHROPIC_SDK_CACHES:
        copy.__dict__.pop(cached, None)
    return copy
