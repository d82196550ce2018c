"""The session environment: who the loop is talking to, as whom, in which session.

`SessionEnv` is the graph's `context_schema`: it is fixed for one run, never
checkpointed, and LangGraph Studio renders it as the assistant's form. It is a
pydantic model so that a bad value (an unknown actor, say) is rejected when the
caller builds it — before any node runs — with an error naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field

from nodes.kernel.choices import Actor

RESTRICTED_ACTORS: frozenset[str] = frozenset({"group", "stranger"})


class SessionEnv(BaseModel):
    """Immutable facts about one run of the loop.

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
        description='The platform says this input mentions the companion (an @-mention it resolved); a group chat under GroupPresence(reply="mentioned") answers it.',
    )

    @property
    def restricted(self) -> bool:
        """Group and stranger sessions: read-only memory, locked-down tools."""
        return self.actor in RESTRICTED_ACTORS


class SessionMismatchError(ValueError):
    """A run whose context names another actor than its thread was opened as, or, continuing
    an interrupted turn, another persona than the turn's: nothing of it ran or was stored."""


PersonaOf = Callable[[SessionEnv], "str | None"]
"""The persona a run under an env answers as (`nodes.core.loop.Loop.persona_for`)."""


def bound_env(
    claimed: SessionEnv | None,
    *,
    thread_actor: str | None,
    turn: SessionEnv | None,
    persona_of: PersonaOf,
    thread: str | None,
) -> SessionEnv:
    """The env a run on a thread runs under: what the thread and its turn were opened as.

    A thread's actor is fixed by its first turn (`thread_actor`; None for a new thread),
    and a turn's persona by the run that opened it. A run that continues an interrupted
    turn (a resume, a `Command`) runs as that turn (`turn`), whatever its own context
    says; a new turn runs as the thread's actor, with the persona its context picks. A
    context that leaves a field unset (`SessionEnv()`, `None`) takes the thread's; one
    that names a different actor, or, continuing a turn, a different persona, is refused.

    Raises:
        SessionMismatchError: the context names an actor or persona the thread or the
            turn was not opened as.
    """
    given = claimed if claimed is not None else SessionEnv()
    named = claimed.model_fields_set if claimed is not None else frozenset()
    own = turn.actor if turn is not None else thread_actor
    if own is not None and "actor" in named and given.actor != own:
        raise SessionMismatchError(
            f"thread {thread!r} was opened as {own!r}; a run on it cannot be {given.actor!r} "
            f"(pass SessionEnv(actor={own!r}), or leave the actor unset; another party's "
            "chat needs a thread of its own)"
        )
    if turn is None:
        return given if own is None else given.model_copy(update={"actor": own})
    asked = persona_of(given.model_copy(update={"actor": own}))
    if "persona_id" in named and asked != turn.persona_id:
        raise SessionMismatchError(
            f"thread {thread!r}: the interrupted turn was opened as persona "
            f"{turn.persona_id!r} and continues as it, not as {asked!r} (leave persona_id "
            "unset to resume it)"
        )
    return turn


def env_of(runtime: Runtime[SessionEnv] | ToolRuntime[Any, Any] | None) -> SessionEnv:
    """The run's SessionEnv; a run started without one is the owner's.

    The boundary (`nodes.boundary.admission.admit`) refuses any other context, so
    anything else here is a bug and fails loudly instead of running as the owner.
    """
    context = runtime.context if runtime is not None else None
    if context is None:
        return SessionEnv()
    if not isinstance(context, SessionEnv):
        raise TypeError(f"context must be a SessionEnv, got {type(context).__name__}")
    return context
