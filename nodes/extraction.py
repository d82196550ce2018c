"""`extract_memory`: turn the finished conversation into long-term memories.

Seed `extractMemory` / `extractMemoryAsync` / `persistMemories`: restricted
sessions never write; every item is stamped with the turn's persona and real
provenance; an extractor with `background = True` runs off the reply path on
a snapshot, under a deadline; failures are logged, never raised into the turn.
"""

from __future__ import annotations

import logging
from functools import partial

from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from memory.items import MemoryItem, Source
from memory.policy import stamp
from memory.transcript import last_human
from nodes.context import env_of, is_hidden
from nodes.env import SessionEnv
from nodes.loop import Loop

log = logging.getLogger("cyrene.memory")

# Small enough that one embedded Chroma write (which holds the interpreter)
# delays a turn that starts meanwhile by a few milliseconds at most.
BACKGROUND_WRITE_BATCH = 8


def make_extract_memory(loop: Loop):
    def extract_memory(state: dict, config: RunnableConfig, runtime: Runtime[SessionEnv]) -> dict:
        """Run the extractor on this turn (in the background if it asks); never in group/stranger chats."""
        env = env_of(runtime)
        extractor, store = loop.config.extractor, loop.config.memory
        if env.restricted or extractor is None or store is None:
            return {}
        human = last_human(state["messages"])
        if human is not None and is_hidden(human):
            return {}  # a guard blocked this turn: its text must reach no model, extractors included
        snapshot = [m for m in state["messages"] if not is_hidden(m)]
        persona_id = loop.persona_for(env)
        source = Source(
            session_id=loop.session_id(env, config), message_id=loop.turn_id(env, snapshot)
        )

        def extract() -> list[MemoryItem]:
            return list(extractor.extract(snapshot))

        def persist(items: list[MemoryItem], *, between_turns: bool = False) -> int:
            stamped = stamp(items, persona_id=persona_id, source=source)
            size = BACKGROUND_WRITE_BATCH if between_turns else max(len(stamped), 1)
            for start in range(0, len(stamped), size):
                if between_turns:
                    loop.jobs.wait_for_idle()
                store.add_many(stamped[start : start + size])
            return len(stamped)

        if getattr(extractor, "background", False):
            loop.jobs.submit(extract, partial(persist, between_turns=True))
            return {}
        try:
            persist(extract())
        except Exception:
            log.exception("memory extraction failed; the turn goes on")
        return {}

    return extract_memory
