"""`finish_turn`: report the finished turn and record the mood it produced."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.runtime import Runtime

from nodes.core.env import SessionEnv, env_of
from nodes.core.loop import Loop
from nodes.core.state import LoopState
from nodes.kernel.compat import sync_node
from nodes.kernel.hooks import run_hook
from nodes.kernel.messages import last_human, message_text
from nodes.kernel.transcript import annotated, final_ai_message
from nodes.turn_end.settings import TurnEnd


def make_finish_turn(loop: Loop) -> Runnable[Any, Any]:
    def finish_turn(
        state: LoopState, config: RunnableConfig, runtime: Runtime[SessionEnv]
    ) -> dict[str, Any]:
        """Call the turn-end hook (user_text, assistant_text, persona) and record its mood."""
        hook = loop.feature(TurnEnd).hook
        if hook is None:
            return {}
        messages = state["messages"]
        human, final = last_human(messages), final_ai_message(messages)
        mood = run_hook(
            "TurnEnd.hook",
            hook,
            message_text(human) if human else "",
            message_text(final) if final else "",
            loop.persona_for(env_of(runtime)),
        )
        update: dict = {"mood": mood}
        if final is not None and mood is not None:
            update["messages"] = [annotated(final, mood=mood)]
        return update

    return sync_node(finish_turn, "finish_turn")
