"""The session environment: who the loop is talking to, as whom, in which session.

`SessionEnv` is the graph's `context_schema`: it is fixed for one run, never
checkpointed, and LangGraph Studio renders it as the assistant's form. It is a
pydantic model so that a bad value (an unknown actor, say) is rejected when the
caller builds it — before any node runs — with an error naming the field.
"""

from __future__ import annotations

from typing import Any

from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field

from nodes.choices import Actor

RESTRICTED_ACTORS: frozenset[str] = frozenset({"group", "stranger"})


class SessionEnv(BaseModel):
    """Immutable facts about one run of the loop (the seed's `SessionEnv`).

    Every field is optional so that `SessionEnv()` means "the owner, the default
    persona, session = thread id, turn = the inbound human message id".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    actor: Actor = Field(
        default="owner",
        description="Who is speaking: the owner, a group chat, a stranger, or an internal flow.",
    )
    persona_id: str | None = Field(
        default=None,
        description="Persona to answer as; unknown ids and restricted sessions use the default.",
    )
    session_id: str | None = Field(
        default=None, description="Session id for memory provenance; defaults to the thread id."
    )
    turn_id: str | None = Field(
        default=None,
        description="Inbound message id for memory provenance; defaults to the last human message id.",
    )
    mentioned: bool = Field(
        default=False,
        description="The platform says this input mentions the companion (an @-mention it resolved); a group chat's group_reply answers it.",
    )

    @property
    def restricted(self) -> bool:
        """Group and stranger sessions: read-only memory, locked-down tools."""
        return self.actor in RESTRICTED_ACTORS


def env_of(runtime: Runtime[SessionEnv] | ToolRuntime[Any, Any] | None) -> SessionEnv:
    """The run's SessionEnv; a run started without one is the owner's.

    The boundary (`nodes.boundary.admit`) refuses any other context, so
    anything else here is a bug and fails loudly instead of running as the owner.
    """
    context = runtime.context if runtime is not None else None
    if context is None:
        return SessionEnv()
    if not isinstance(context, SessionEnv):
        raise TypeError(f"context must be a SessionEnv, got {type(context).__name__}")
    return context
