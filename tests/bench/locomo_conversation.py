"""Conversation recall on LoCoMo: does the evidence of a question reach the model's view?

    python -m tests.bench.locomo_conversation             # 10 conversations, ~5 min
    python -m tests.bench.locomo_conversation --quick     # 2 conversations
    python -m tests.bench.locomo_conversation --budgets 200,400,800

Each LoCoMo conversation (the data as `tests.bench.locomo` finds it: `$CYRENE_LOCOMO`)
becomes one owner session of the real graph: its first speaker is the owner (human
messages), the other the companion (the persona's replies), every turn dated by its
session's date, all imported in one `Trusted` turn. Compaction is on
(`Compaction(max_context_tokens=4000)`), so all but the last ~2,000 tokens move to the
transcript archive. No memory store, no extractor: only what compaction keeps (the
summary, the live window) and what `ConversationRecall` brings back.

Then each question (categories 1-4) is the owner's next message to a scripted model
that records what it is sent. A question is found when the text of one of its
evidence turns is in that request. Printed per budget: found (all, and per
category), found through recall (the evidence was archived), found in the window, and
the tokens the recall block adds per request (`nodes.recall.block.estimated_tokens`,
mean and p95), and seconds per turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graph import Compaction, ConversationRecall, Trusted, build_graph, open_checkpointer
from nodes.kernel.messages import message_text
from nodes.kernel.text import as_data
from nodes.kernel.transcript import dated
from nodes.recall.block import RECALL_HEADER, estimated_tokens
from nodes.recall.index import SESSION_INDEXES
from tests.bench.locomo import HOW_TO_GET, Corpus, load_locomo, locomo_path, table
from tests.boundary_support import endless
from tests.conftest import make_config

COMPACTION_BUDGET = 4_000


def imported(corpus: Corpus) -> tuple[list[BaseMessage], dict[str, str]]:
    """The conversation as the owner's session: its messages, and each turn's text by id."""
    speakers: list[str] = []
    messages: list[BaseMessage] = []
    texts: dict[str, str] = {}
    for memory in corpus.memories:
        speaker, _, text = memory.text.partition(": ")
        if speaker not in speakers:
            speakers.append(speaker)
        texts[memory.id] = text
        when = datetime.fromtimestamp(memory.created_at, UTC)
        said = HumanMessage(text) if speaker == speakers[0] else AIMessage(text, name="xilian")
        messages.append(dated(said, when))
    return messages, texts


def recall_tokens(view: Sequence[BaseMessage]) -> int:
    """Tokens of the recall block in a request (0: none)."""
    for message in view:
        text = message_text(message)
        if RECALL_HEADER in text:
            return estimated_tokens(text[text.index(RECALL_HEADER) :])
    return 0


def run(corpora: Sequence[Corpus], budget: int) -> dict[str, object]:
    """Every question of every conversation, asked with a recall budget of `budget` tokens."""
    found: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    tokens: list[int] = []
    through = {"recall": 0, "window": 0}
    turns, started = 0, time.perf_counter()
    for corpus in corpora:
        model = endless()
        features = [
            Compaction(max_context_tokens=COMPACTION_BUDGET),
            ConversationRecall(max_tokens=budget),
        ]
        with open_checkpointer("memory") as saver:
            graph = build_graph(make_config(model, features=features), saver)
            config = {"configurable": {"thread_id": corpus.name}}
            history, texts = imported(corpus)
            graph.invoke(Trusted({"messages": [*history, HumanMessage("（导入完毕）")]}), config)
            archived = graph.get_state(config).values["archived"]["messages"]
            print(f"{corpus.name}: {len(history)} turns, {archived} archived", file=sys.stderr)
            for question in corpus.questions:
                SESSION_INDEXES.settled()
                graph.invoke({"messages": [HumanMessage(question.text)]}, config)
                turns += 1
                view = model.requests[-1].messages
                seen = "\n".join(message_text(m) for m in view)
                hit = any(texts[e] in seen or as_data(texts[e]) in seen for e in question.answers)
                asked[question.group] += 1
                found[question.group] += hit
                added = recall_tokens(view)
                tokens.append(added)
                if hit:
                    block = seen[seen.index(RECALL_HEADER) :] if added else ""
                    in_block = any(as_data(texts[e]) in block for e in question.answers)
                    through["recall" if in_block else "window"] += 1
    total = sum(asked.values())
    return {
        "budget": budget,
        "found": sum(found.values()) / total,
        "by category": {g: found[g] / asked[g] for g in sorted(asked)},
        "questions": total,
        "through": through,
        "tokens mean": statistics.fmean(tokens),
        "tokens p95": sorted(tokens)[int(0.95 * (len(tokens) - 1))],
        "s per turn": (time.perf_counter() - started) / max(turns, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 conversations")
    parser.add_argument(
        "--budgets", default="400", help="comma-separated recall budgets in tokens (400)"
    )
    args = parser.parse_args(argv)
    path = locomo_path()
    if path is None or not path.exists():
        print(HOW_TO_GET)
        return
    corpora = load_locomo(path, limit=2 if args.quick else None)
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        result = run(corpora, budget)
        by = result["by category"]
        assert isinstance(by, dict)
        through = result["through"]
        assert isinstance(through, dict)
        rows.append(
            [
                str(budget),
                f"{result['found']:.3f}",
                " ".join(f"{g}:{v:.2f}" for g, v in by.items()),
                f"{through['recall']} / {through['window']}",
                f"{result['tokens mean']:.0f} / {result['tokens p95']}",
                f"{result['s per turn']:.3f}",
            ]
        )
    print(
        f"LoCoMo conversation recall: {len(corpora)} conversations, "
        f"{sum(len(c.questions) for c in corpora)} questions, compaction budget "
        f"{COMPACTION_BUDGET}\n"
    )
    head = [
        "recall budget",
        "found",
        "by category",
        "found via recall / window",
        "tokens added mean / p95",
        "s per turn",
    ]
    print(table(head, rows))


if __name__ == "__main__":
    main()
