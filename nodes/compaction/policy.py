"""Compaction: keep the model view under its token budget, and the checkpoints the size of it.

Every round, before the model is called (the `CompactWhenDue` policy; in a graph
built with `ModelView(own_step=True)`, the `compact` node does the same as a step
of its own), a cheap check decides whether anything is due. When it is, two steps:

1. **Summarise.** When the estimated view passes the budget
   (`Compaction.max_context_tokens`, or the answering model's share with
   `"auto"`), older turns fold into the running summary until the whole view
   (the blocks, the new summary at its bound, and the turns kept verbatim) is
   back to `LOW_WATER` of the budget: the boundary moves in large steps,
   rarely, so the request's prefix (which a provider caches) stays the same for
   many rounds between them. The estimate is the view exactly as it
   will be sent (attribution notes and the caller's transform included) except the
   memory block, which `memory_k` bounds; searching twice per round would
   double the retrieval cost. A compactor that fails or returns nothing is
   logged and the round goes on uncompacted. A summary written before the session forgot
   a turn it covers is first written again without it (`nodes.compaction.rewrite`), so
   the next summary starts from one that holds none of its words.
2. **Archive.** Messages the summary covers are never sent again: they move
   from the checkpointed window to the transcript archive beside the
   checkpoints (`nodes.core.protocols.TranscriptArchive`), so a session's per-turn
   cost does not grow with its age. The archive is written before the step's
   checkpoint; a step re-run after a crash writes the same positions again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, SystemMessage
from langchain_core.runnables import RunnableConfig

from nodes.compaction.rewrite import rewritten
from nodes.compaction.settings import Compaction, Compactor, Describe
from nodes.compaction.summary import (
    StructuralCompactor,
    TokenCounter,
    in_budget_units,
    plan_cut,
    token_counter,
)
from nodes.context.assemble import round_blocks, view_blocks, view_of_state, visible_conversation
from nodes.context.attribution import Speaker, describe_speaker, role_declaration, speaker_note
from nodes.context.forgotten import forgotten_turns, summary_outdated
from nodes.context.layout import system_messages
from nodes.core.env import SessionEnv
from nodes.core.policy import CallModel, CallSteps, ModelCall, Round, RoundPolicy
from nodes.core.stages import COMPACT, Stages
from nodes.core.state import ArchiveMark, LoopState, Summary, turn_of, uncovered_start
from nodes.kernel.compat import checkpointer_of, graph_namespace
from nodes.kernel.run_config import thread_id
from nodes.kernel.sanitize import MAX_NAME_CHARS
from nodes.kernel.steps import Work
from nodes.kernel.transcript import opener_before, without_turns
from nodes.token_accounting.aside import add_aside, measured
from nodes.token_accounting.state import TokenUsageState

if TYPE_CHECKING:
    from nodes.core.loop import Loop

log = logging.getLogger("cyrene.compaction")


LOW_WATER = 0.75
"""The share of the budget the whole view is cut back to when it passes the budget, its
blocks (every persona's instructions under `ModelView(layout="cache")`) and the summary at
its bound included. A compaction changes everything after the cached lead, so its request
and the ones after it pay for the conversation again; a quarter of the budget left to grow
into keeps the next one rounds away, however large the blocks are (counting the
conversation alone, as before, a large lead made it fire every round)."""
SUMMARY_SHARE = 0.25
"""The share of the budget the summary may take."""
SUMMARY_REFRESH_TURNS = 25
"""Turns after which an unchanged summary is written again. LangGraph finds a
`DeltaChannel`'s value by walking back to the checkpoint of its last write, so a
summary left alone for a thousand turns would make every load walk a thousand
turns; written again every 25 turns, the walk stays within the one the transcript
needs anyway (the transcript snapshots every 100 updates)."""


def context_budget(loop: Loop, persona_id: str | None) -> int:
    """The compaction budget for the persona's model (0 = compaction off)."""
    return loop.feature(Compaction).budget_for(loop.model_for(persona_id))


def compactor_of(loop: Loop) -> Compactor:
    """The configured compactor, or the structural one (no model call)."""
    return loop.feature(Compaction).compactor or StructuralCompactor()


def summarised(
    loop: Loop, compactor: Compactor, env: SessionEnv, state: LoopState, forgotten: Set[str]
) -> Summary | None:
    """The new running summary when the view is over budget, else None (`forgotten`: the
    session's forgotten turns, `nodes.context.forgotten`)."""
    persona_id = loop.persona_for(env)
    model = loop.model_for(persona_id)
    budget = context_budget(loop, persona_id)
    count = token_counter(model)
    messages, summary = state["messages"], state.get("summary")
    if budget <= 0 or not over_budget(loop, env, state, budget, count, forgotten):
        return None
    start = uncovered_start(messages, summary)
    # Only messages after the summary can move; earlier ones are never re-counted.
    sizes = [0] * start + [count([m]) for m in messages[start:]]
    cut = plan_cut(messages, start, kept_budget(loop, env, state, budget, count), sizes)
    if cut is None:
        return None
    describe = speaker_describer(loop, env)
    previous = summary["text"] if summary else None
    # A forgotten turn's words go into no new summary (`previous` is rewritten before).
    opener = opener_before(messages, start)
    folded = without_turns(messages[start:cut], forgotten, opener=opener, answering=False)
    try:
        text = in_budget_units(compactor, count).compact(
            folded, previous, int(budget * SUMMARY_SHARE), describe
        )
    except Exception:
        log.exception("compactor failed; this round goes on uncompacted")
        return None
    if not text or not text.strip():
        log.warning("compactor returned nothing; this round goes on uncompacted")
        return None
    upto = str(messages[cut - 1].id)
    return Summary(text=text.strip(), upto=upto, turn=turn_of(state), left_out=sorted(forgotten))


def speaker_describer(loop: Loop, env: SessionEnv) -> Describe:
    """How the session's summaries name each message's speaker."""
    return partial(
        describe_speaker,
        restricted=env.restricted,
        current=loop.persona_for(env),
        display_name=loop.display_name,
    )


def rewritten_without(
    loop: Loop,
    compactor: Compactor,
    env: SessionEnv,
    state: LoopState,
    config: RunnableConfig,
    forgotten: Set[str],
) -> Summary | None:
    """The summary written again without the turns forgotten since it was written, when it
    covers one (`nodes.compaction.rewrite`); None when it needs no rewrite."""
    persona_id = loop.persona_for(env)
    budget = context_budget(loop, persona_id)
    return rewritten(
        loop,
        compactor,
        state,
        config,
        forgotten,
        budget=budget,
        share=int(budget * SUMMARY_SHARE),
        describe=speaker_describer(loop, env),
        count=token_counter(loop.model_for(persona_id)),
    )


def kept_budget(
    loop: Loop, env: SessionEnv, state: LoopState, budget: int, count: TokenCounter
) -> int:
    """Tokens of conversation the cut may keep verbatim: what is left of `LOW_WATER` of the
    budget once the view's own blocks (instructions or every persona's, time, working memory,
    the role declaration) and the new summary at its bound are in (0: only the current turn).
    The notes before the kept messages are not counted, as `plan_cut` counts no notes."""
    persona_id = loop.persona_for(env)
    blocks = round_blocks(loop, persona_id, working_memory=state.get("working_memory"))
    own = [blocks.cast or blocks.instructions, blocks.time, blocks.working_memory]
    declaration = role_declaration(
        restricted=env.restricted, current=persona_id, display_name=loop.display_name
    )
    fixed = text_tokens("\n\n".join([*own, declaration]), count)
    return max(int(budget * (LOW_WATER - SUMMARY_SHARE)) - fixed, 0)


def text_tokens(text: str, count: TokenCounter) -> int:
    """`text`'s tokens in the model's own counter, counted as a user message: Anthropic's
    counter refuses system text alone, which `token_counter` then only estimates (~4
    characters a token, which text in CJK exceeds several times)."""
    return count([HumanMessage(text)])


def over_budget(
    loop: Loop,
    env: SessionEnv,
    state: LoopState,
    budget: int,
    count: TokenCounter,
    forgotten: Set[str],
) -> bool:
    """Whether the view passes `budget`: first a bound that needs no attribution (what the
    view holds, plus the role declaration and the longest speaker note before every
    message), and only when the bound passes it, the view itself."""
    persona_id = loop.persona_for(env)
    conversation = visible_conversation(state["messages"], state.get("summary"), forgotten)
    blocks = round_blocks(
        loop, persona_id, working_memory=state.get("working_memory"), summary=state.get("summary")
    )
    leading = system_messages(
        [blocks.cast or blocks.instructions, blocks.time, blocks.working_memory, blocks.summary]
    )
    declaration, per_note = loop.remembered(
        ("note allowance", persona_id), lambda: note_allowance(loop, persona_id, count)
    )
    bound = count([*leading, *conversation]) + declaration + per_note * len(conversation)
    return bound > budget and count(view_of_state(loop, env, state, estimate=True)) > budget


def note_allowance(loop: Loop, persona_id: str | None, count: TokenCounter) -> tuple[int, int]:
    """(tokens of the longest role declaration, of the longest speaker note) for `count`."""
    declaration = role_declaration(
        restricted=True, current=persona_id, display_name=loop.display_name
    )
    notes = [SystemMessage(note) for note in longest_notes(loop)]
    return count([SystemMessage(declaration)]), max(count([note]) for note in notes)


def longest_notes(loop: Loop) -> list[str]:
    """The longest note each kind of speaker can get: a third party's with the longest
    display name the boundary lets in, and each persona's."""
    name = loop.display_name
    third_party = Speaker("", "third_party", "名" * MAX_NAME_CHARS)
    personas = [Speaker("", "persona", pid) for pid in loop.config.personas]
    return [speaker_note(s, current=None, display_name=name) for s in [third_party, *personas]]


def refreshed(state: LoopState) -> Summary | None:
    """The unchanged summary, written again when its last write is `SUMMARY_REFRESH_TURNS` old."""
    summary = state.get("summary")
    if not summary:  # nothing to refresh: no turns to count
        return None
    turn = turn_of(state)
    if turn - summary.get("turn", 0) < SUMMARY_REFRESH_TURNS:
        return None
    return Summary(**{**summary, "turn": turn})


def archived(
    loop: Loop, config: RunnableConfig, state: LoopState, summary: Summary | None
) -> dict[str, Any]:
    """The update that moves every message `summary` covers to the archive ({} when none is
    covered, or the graph saves nothing)."""
    messages = state["messages"]
    covered = uncovered_start(messages, summary)
    saver = checkpointer_of(config)
    if covered == 0 or saver is None or (archive := loop.archives(saver)) is None:
        return {}
    moved: list[BaseMessage] = list(messages[:covered])
    mark = state.get("archived") or ArchiveMark(messages=0, humans=0)
    where = (str(thread_id(config)), graph_namespace(config))
    archive.append(where, mark["messages"], moved)
    humans = sum(isinstance(m, HumanMessage) for m in moved)
    return {
        "messages": [RemoveMessage(id=str(m.id)) for m in moved],
        "archived": ArchiveMark(
            messages=mark["messages"] + covered, humans=mark["humans"] + humans
        ),
    }


def compaction_due(loop: Loop, env: SessionEnv, state: LoopState, forgotten: Set[str]) -> bool:
    """Whether a compaction step has work: the view passes its budget, messages the
    summary covers are still in the window (a session written before the archive), or the
    session forgot a turn since the summary was written."""
    persona_id = loop.persona_for(env)
    budget = context_budget(loop, persona_id)
    if budget <= 0:
        return False
    if uncovered_start(state["messages"], state.get("summary")) > 0:
        return True
    if summary_outdated(state.get("summary"), forgotten):
        return True
    count = loop.remembered(
        ("counter", persona_id), lambda: token_counter(loop.model_for(persona_id))
    )
    return over_budget(loop, env, state, budget, count, forgotten)


def compacted(
    loop: Loop, compactor: Compactor, env: SessionEnv, state: LoopState, config: RunnableConfig
) -> dict[str, Any]:
    """A compaction step's state update: the new (rewritten, or refreshed) summary, and what
    it covers moved to the archive."""
    forgotten = forgotten_turns(loop, env, config) or frozenset()
    rewrite = rewritten_without(loop, compactor, env, state, config, forgotten)
    if rewrite is not None:  # what is summarised next starts from the rewrite
        state = cast(LoopState, {**state, "summary": rewrite})
    summary = summarised(loop, compactor, env, state, forgotten) or refreshed(state) or rewrite
    update: dict[str, Any] = {} if summary is None else {"summary": summary}
    return {**update, **archived(loop, config, state, summary or state.get("summary"))}


def applied(state: LoopState, update: dict[str, Any]) -> LoopState:
    """`state` as it reads once a compaction `update` is written (archived messages gone)."""
    removed = {m.id for m in update.get("messages", [])}
    window = [m for m in state["messages"] if m.id not in removed]
    return cast(LoopState, {**state, **update, "messages": window})


class CompactWhenDue(RoundPolicy):
    """Around the model call, outermost: compact when due, and send the view of the
    compacted state. The check is cheap and runs in place; summarising (an LLM compactor)
    and archiving (database writes) run as blocking work, only when due."""

    @classmethod
    def for_loop(cls, loop: Loop, stages: Stages) -> Sequence[RoundPolicy]:
        # A graph whose `compact` is a step of its own (`stages.round_start`) compacts there.
        on = loop.feature(Compaction).on and stages.round_start != COMPACT
        return [cls(loop)] if on else []

    blocking = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.compactor = compactor_of(loop)
        self.view_blocks = view_blocks(loop)

    def wrap_model_call(self, round: Round, request: ModelCall, call: CallModel) -> CallSteps:
        forgotten = forgotten_turns(self.loop, round.env, round.config) or frozenset()
        if not compaction_due(self.loop, round.env, round.state, forgotten):
            if (summary := refreshed(round.state)) is not None:
                round.write(summary=summary)
            return (yield from call(request))
        args = (compacted, self.loop, self.compactor, round.env, round.state, round.config)
        update, usage = yield Work(measured, args, blocks=True)
        stored = cast(TokenUsageState, round.state).get("token_usage")
        add_aside(round.update, stored, "compaction", usage)
        if update:
            round.write(**update)
            round.state = applied(round.state, update)
            view_args = (self.loop, round.env, round.state)
            assemble = partial(view_of_state, config=round.config)
            round.view = yield Work(assemble, view_args, blocks=self.view_blocks)
            request = request.override(view=round.view)
        return (yield from call(request))
