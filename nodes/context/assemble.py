"""The model's view of the conversation, assembled fresh every round.

Blocks: persona instructions, current time (only with a valid zone), working
memory (the caller's text, as one line of data: `nodes.kernel.text.as_data`), memory block (retrieval re-run every round from the latest user
text), the compaction summary when there is one, role declaration, and the
conversation with speaker notes. `ModelView.layout` places them
(`nodes.context.layout`): by default round first (the
round's blocks right after the instructions, which are always the first system message), or with the
blocks that change every round last and every persona's instructions first. Then the caller's
`ModelView.transform(messages, round)`. Nothing here is written to the
transcript.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence, Set
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from memory.retrieval.block import format_memory_block
from nodes.context.attribution import attribute_conversation, describe_speaker, speaker_label
from nodes.context.encoding import encode_for_provider, without_unsafe_names
from nodes.context.forgotten import forgotten_turns, summary_outdated, window_opener
from nodes.context.layout import LAYOUTS, Blocks
from nodes.context.settings import ModelView
from nodes.context.summary import summary_message
from nodes.core.env import SessionEnv
from nodes.core.state import LoopState, Summary, uncovered_start
from nodes.kernel.replies import unique_call_ids
from nodes.kernel.text import as_data
from nodes.kernel.transcript import (
    current_round,
    is_hidden,
    latest_user_text,
    opener_before,
    without_turns,
)
from nodes.recall.block import recall_block

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.context")

WORKING_MEMORY_PREFIX = "工作记忆: "
CAST_INTRO = (
    "本会话可能由下列角色作答。你当前是哪一个，以本轮附加的「会话角色」说明为准，"
    "只按那一个角色的设定说话。"
)
CAST_MARKER = "[角色设定] "
_WEEKDAYS = "一二三四五六日"


def time_block(now: datetime, zone: ZoneInfo) -> str:
    """The per-round wall-clock line, in the configured zone."""
    local = now.astimezone(zone)
    return f"当前时间：{local:%Y-%m-%d %H:%M}（星期{_WEEKDAYS[local.weekday()]}，{zone.key}）"


def view_blocks(loop: Loop) -> bool:
    """Whether assembling a view may block: it searches memory and runs the caller's
    transform."""
    return loop.config.memory is not None or loop.feature(ModelView).transform is not None


def memory_block(loop: Loop, env: SessionEnv, persona_id: str | None, query: str) -> str:
    """The scoped memory block for this round, or '' (no store, no query, or a failed search)."""
    store = loop.config.memory
    if store is None or not query.strip():
        return ""
    try:
        results = store.search(
            query,
            persona_id=persona_id,
            restricted=env.restricted,
            k=loop.feature(ModelView).memory_k,
        )
    except Exception:
        log.exception("memory search failed; this round goes on without memories")
        return ""
    return format_memory_block(results, restricted=env.restricted)


def round_blocks(
    loop: Loop,
    persona_id: str | None,
    *,
    working_memory: str | None,
    memory: str = "",
    summary: Summary | None = None,
) -> Blocks:
    """This round's system blocks as text, before the layout places them."""
    persona = loop.persona(persona_id)
    folded = summary_message(summary)
    cached = loop.feature(ModelView).layout == "cache"
    return Blocks(
        instructions=persona.instructions if persona else "",
        time=time_block(loop.now(), loop.zone) if loop.zone is not None else "",
        working_memory=WORKING_MEMORY_PREFIX + as_data(working_memory) if working_memory else "",
        memory=memory,
        summary=str(folded.content) if folded else "",
        cast=loop.remembered("persona cast", lambda: persona_cast(loop)) if cached else "",
    )


def persona_cast(loop: Loop) -> str:
    """Every persona's instructions, in the config's order, each under its label ('' with
    at most one persona): the lead of every request under `ModelView(layout="cache")`,
    whichever persona answers."""
    personas = loop.config.personas
    if len(personas) < 2:
        return ""
    parts = [
        f"{CAST_MARKER}{speaker_label(pid, loop.display_name)}\n{persona.instructions}"
        for pid, persona in personas.items()
    ]
    return "\n\n".join([CAST_INTRO, *parts])


def visible_conversation(
    messages: Sequence[BaseMessage],
    summary: Summary | None,
    forgotten: Set[str] = frozenset(),
    *,
    archived_opener: Callable[[], str | None] | None = None,
) -> list[BaseMessage]:
    """What the model still sees verbatim: after the summary, minus guard-hidden messages and
    the turns `forgotten` opened (`nodes.context.forgotten`). `archived_opener` is asked for
    the opening of the turn the window starts in only when `messages` do not hold it
    (compaction cut inside that turn and archived its opening)."""
    start = uncovered_start(messages, summary)
    window = messages[start:]
    if forgotten:
        opener = opener_before(messages, start)
        starts_inside = bool(window) and not isinstance(window[0], HumanMessage)
        if opener is None and starts_inside and archived_opener is not None:
            opener = archived_opener()
        window = without_turns(window, forgotten, opener=opener)
    return [m for m in window if not is_hidden(m)]


def assemble_view(
    loop: Loop,
    env: SessionEnv,
    messages: Sequence[BaseMessage],
    *,
    working_memory: str | None = None,
    summary: Summary | None = None,
    with_memory: bool = True,
    with_transform: bool = True,
    config: RunnableConfig | None = None,
    archived: int = 0,
) -> list[BaseMessage]:
    """The exact message list the model is sent this round (`with_memory=False`,
    `with_transform=False`: minus the memory block and the caller's transform, which is how
    compaction estimates the view without searching or transforming twice). With the
    run's `config` and the session's `archived` count, the memory block also recalls the
    archived conversation (`nodes.recall`)."""
    persona_id = loop.persona_for(env)
    forgotten = forgotten_turns(loop, env, config)
    opener = partial(window_opener, loop, config, archived)
    conversation = unique_call_ids(
        visible_conversation(messages, summary, forgotten or frozenset(), archived_opener=opener)
    )
    memory = ""
    if with_memory:
        query = latest_user_text(conversation)
        # Every archived message has a known speaker: unlabelled ones are the owner's and
        # the answering persona's, as in a restricted session.
        describe = partial(
            describe_speaker, restricted=True, current=persona_id, display_name=loop.display_name
        )
        recalled = recall_block(loop, env, config, archived, query, describe, forgotten)
        memory = "\n\n".join(b for b in (memory_block(loop, env, persona_id, query), recalled) if b)
    # A summary that may hold a turn forgotten since is not shown until compaction rewrites it.
    shown = None if summary_outdated(summary, forgotten or frozenset()) else summary
    blocks = round_blocks(
        loop, persona_id, working_memory=working_memory, memory=memory, summary=shown
    )
    settings = loop.feature(ModelView)
    attribution = attribute_conversation(
        conversation,
        restricted=env.restricted,
        current=persona_id,
        display_name=loop.display_name,
        stable_notes=settings.layout == "cache",
    )
    placed = LAYOUTS[settings.layout](blocks, attribution)
    provider = loop.provider_for(persona_id)
    view = encode_for_provider(
        settings.encoding_for(provider),
        placed.leading,
        placed.attribution,
        trailing=placed.trailing,
        notes_inline=placed.notes_inline,
        after_lead=placed.after_lead,
    )
    if provider == "openai":
        view = without_unsafe_names(view)
    return apply_transform(loop, view, current_round(messages) + 1) if with_transform else view


def apply_transform(loop: Loop, view: list[BaseMessage], round_: int) -> list[BaseMessage]:
    """The caller's `ModelView.transform`; if it fails, the untransformed view is sent."""
    transform = loop.feature(ModelView).transform
    if transform is None:
        return view
    try:
        return list(transform(view, round_))
    except Exception:
        log.exception("ModelView.transform failed; round %d uses the untransformed view", round_)
        return view


def view_of_state(
    loop: Loop,
    env: SessionEnv,
    state: LoopState,
    *,
    estimate: bool = False,
    config: RunnableConfig | None = None,
) -> list[BaseMessage]:
    """The round's view from the session's state (`estimate`: as compaction counts it,
    without the memory block and the caller's transform; `config`: the run's, to recall
    the session's archived conversation)."""
    return assemble_view(
        loop,
        env,
        state["messages"],
        working_memory=state.get("working_memory"),
        summary=state.get("summary"),
        with_memory=not estimate,
        with_transform=not estimate,
        config=config,
        archived=mark["messages"] if (mark := state.get("archived")) else 0,
    )
