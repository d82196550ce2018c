"""Speaker attribution as a LangChain middleware, for an agent built without this loop.

`create_agent(model, middleware=[SpeakerAttribution(...)])` gets what the loop's
own view does: a role declaration, and a `[发言归属]` note wherever the speaker
changes (a persona's reply, a third party's message), so that one persona does
not take another's words, or a group member's, for its own. The notes are
system text the middleware adds to each request; the agent's state is unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import SystemMessage

from nodes.context.attribution import attribute_conversation
from nodes.core.env import SessionEnv


class SpeakerAttribution(AgentMiddleware):
    """Who said what, in every request of an agent that speaks as `persona_id`.

    Args:
        persona_id: the persona answering (a `SessionEnv` context's `persona_id` wins).
        display_names: persona id → the name the notes show (`Persona.name`).
        restricted: whether unlabelled messages are a third party's session (a
            `SessionEnv` context's `restricted` wins).
    """

    def __init__(
        self,
        persona_id: str,
        display_names: Mapping[str, str] | None = None,
        *,
        restricted: bool = False,
    ) -> None:
        self.persona_id = persona_id
        self.display_names = dict(display_names or {})
        self.restricted = restricted

    def attributed(self, request: ModelRequest) -> ModelRequest:
        """The request with the declaration after its system prompt and the notes inline."""
        context = getattr(request.runtime, "context", None)
        env = context if isinstance(context, SessionEnv) else None
        current = (env.persona_id if env else None) or self.persona_id
        attribution = attribute_conversation(
            request.messages,
            restricted=env.restricted if env else self.restricted,
            current=current,
            display_name=lambda pid: self.display_names.get(pid, pid),
        )
        if attribution.declaration is None:
            return request
        declared = [SystemMessage(attribution.declaration), *attribution.conversation]
        return request.override(messages=cast(Any, declared))

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        return handler(self.attributed(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        return await handler(self.attributed(request))
