"""Memory recall: does a question asked in other words find the fact among unrelated notes?

    python -m tests.bench.memory            # recall, update and LoCoMo rows (~10 min)
    python -m tests.bench.memory --scale    # + search p95 at 100,000 items

The set is `tests/data/memory_recall.jsonl`, written by hand: 160 facts about
one owner (80 Chinese, 80 English), each with the question a user would ask
for it in other words ("主人养了一只叫团子的橘猫" ← "我的宠物叫什么名字？"),
320 unrelated notes in both languages, and 32 update pairs (an old fact, the
fact that replaces it, a question whose answer is the new one), and 20 pairs
of one fact in other words (near-duplicates).

Facts and notes go into one real `MemoryStore` (embedded Chroma, a temporary
folder) spread over the persona, user and project buckets; every question goes
through `MemoryStore.search` as persona `xilian` reads it. Reported per
language: recall@1, recall@5 and MRR@10, for the old lexical default
(`HashingEmbedding`, dense ranking), the new default embedding ranked by its
cosine alone, and the new default as `MemoryStore` ranks it (`Fusion`).

With the LoCoMo data at hand (`tests.bench.locomo` says where it is read from and how
to get it; never committed: CC BY-NC 4.0) the run also prints LoCoMo retrieval,
R@1 / R@5 / R@10, flat and dated side by side, for the store before issue 31
(`tests.bench.locomo_old`), BM25 alone, the store's embedding alone and its default.

`--scale` times `search` (query embedding included) at 100,000 items. Building
that store embeds 100k notes (~7 minutes on 2 cores); it is kept under
`~/.cache/cyrene-bench/` and reused while its embedding and size match.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from memory import Fusion, HashingEmbedding, MemoryItem, MemoryStore, MultilingualEmbedding, Scope
from memory.embedding import cosines
from memory.items import Source
from memory.lifecycle.duplicates import DUPLICATE_COSINE, near_duplicate
from memory.lifecycle.operations import Add, Operation, Recalled, Supersede
from nodes.extraction.planning import apply_changes, plan_extraction
from tests.bench.table import ROWS, elapsed_ms, row

DATA = Path(__file__).resolve().parents[1] / "data" / "memory_recall.jsonl"
CACHE = Path.home() / ".cache" / "cyrene-bench"
LANGUAGES = ("zh", "en")
NOW = 1_900_000_000.0
DAY = 86_400.0
READER = "xilian"
BUCKETS = [(Scope.PERSONA, READER), (Scope.USER, None), (Scope.PROJECT, None)]
DENSE_ONLY = Fusion(lexical_weight=0.0, other_script=1.0)


@dataclass(frozen=True)
class RecallSet:
    """The hand-written set, by kind (each entry as in the file)."""

    facts: list[dict[str, str]]
    distractors: list[dict[str, str]]
    updates: list[dict[str, str]]
    duplicates: list[dict[str, str]]


def load_set(path: Path = DATA) -> RecallSet:
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    kinds: dict[str, list[dict[str, str]]] = {
        "fact": [],
        "distractor": [],
        "update": [],
        "duplicate": [],
    }
    for entry in entries:
        kinds[entry["type"]].append(entry)
    return RecallSet(kinds["fact"], kinds["distractor"], kinds["update"], kinds["duplicate"])


def item(text: str, n: int, created_at: float = NOW - DAY) -> MemoryItem:
    """A memory in one of the reader's three buckets (chosen by `n`)."""
    scope, persona = BUCKETS[n % len(BUCKETS)]
    return MemoryItem(content=text, scope=scope, persona_id=persona, created_at=created_at)


def open_store(folder: Path, embedding: Any, fusion: Fusion | None = None) -> MemoryStore:
    return MemoryStore.open(folder, embedding, clock=lambda: NOW, fusion=fusion)


def ranks(
    store: MemoryStore,
    questions: Iterable[tuple[str, str]],
    k: int = 10,
    restricted: bool = False,
) -> list[int]:
    """The rank of each (question, wanted text) in `search` (the owner asking, unless
    `restricted`: a group member); k + 1 when not in the top k."""
    found = []
    for question, wanted in questions:
        results = store.search(question, persona_id=READER, restricted=restricted, k=k)
        hits = [hit.item.content for hit in results]
        found.append(hits.index(wanted) + 1 if wanted in hits else k + 1)
    return found


def scores(found: list[int]) -> tuple[float, float, float]:
    """recall@1, recall@5, MRR@10 of a list of ranks."""
    n = max(len(found), 1)
    return (
        sum(r <= 1 for r in found) / n,
        sum(r <= 5 for r in found) / n,
        sum(1 / r for r in found if r <= 10) / n,
    )


def recall_of(folder: Path, embedding: Any, fusion: Fusion | None, data: RecallSet) -> dict:
    """Per language (recall@1, recall@5, MRR@10) of one embedding and ranking."""
    with open_store(folder, embedding, fusion) as store:
        notes = [*data.facts, *data.distractors]
        store.add_many(item(note["text"], n) for n, note in enumerate(notes))
        return {
            lang: scores(
                ranks(store, ((f["question"], f["text"]) for f in data.facts if f["lang"] == lang))
            )
            for lang in LANGUAGES
        }


def bench_recall(folder: Path, data: RecallSet) -> list[tuple[str, dict]]:
    configurations = [
        ("lexical `HashingEmbedding` (old default)", HashingEmbedding(), DENSE_ONLY),
        ("USE multilingual, cosine only", MultilingualEmbedding(), DENSE_ONLY),
        ("USE multilingual + `Fusion()` (the default)", MultilingualEmbedding(), None),
    ]
    results = [
        (name, recall_of(folder / f"recall{n}", embedding, fusion, data))
        for n, (name, embedding, fusion) in enumerate(configurations)
    ]
    old, new = results[0][1], results[-1][1]
    for lang in LANGUAGES:
        row(
            f"memory recall, {len(data.facts) // 2} {lang} facts + {len(data.distractors)} notes: "
            "recall@1 / @5 / MRR@10",
            " / ".join(f"{x:.2f}" for x in new[lang]),
            "lexical " + " / ".join(f"{x:.2f}" for x in old[lang]),
            new[lang][1] / max(old[lang][1], 0.01),
            "recall@5 ≥ 0.9",
        )
    return results


class ScriptedUpdates:
    """The scripted extractor of the update rows: told the new fact, it supersedes the
    memory shown that holds the old one (as a model would), or adds the new fact when the
    old one was not among the memories shown."""

    background = False

    def __init__(self, update: dict[str, str]) -> None:
        self.update = update

    def extract(self, messages: Sequence[BaseMessage]) -> list[MemoryItem]:
        return []

    def extract_operations(
        self, messages: Sequence[BaseMessage], memories: Sequence[Recalled]
    ) -> list[Operation]:
        new = MemoryItem(content=self.update["new"], created_at=NOW - DAY)
        for shown in memories:
            if shown.item.content == self.update["old"]:
                return [Supersede(shown.handle, new.model_copy(update={"scope": shown.item.scope}))]
        return [Add(new)]


def apply_updates(store: MemoryStore, data: RecallSet) -> int:
    """Each pair's old fact, then 30 days later the owner states the new one: the scripted
    extractor's operations go through the loop's planning (`plan_extraction`) into the
    store. Returns how many old facts were shown to the extractor (and so superseded)."""
    store.add_many(item(u["old"], n, NOW - 31 * DAY) for n, u in enumerate(data.updates))
    shown = 0
    for n, update in enumerate(data.updates):
        changes = plan_extraction(
            ScriptedUpdates(update),
            [HumanMessage(update["new"])],
            store,
            persona_id=READER,
            source=Source(session_id="bench", message_id=f"u{n}"),
        )
        shown += any(change.action == "supersede" for change in changes)
        apply_changes(store, changes)
    return shown


def bench_updates(folder: Path, data: RecallSet) -> None:
    """Stale facts: after the updates, does the memory block (k=8) still show an old fact?"""
    with open_store(folder / "updates", MultilingualEmbedding()) as store:
        store.add_many(item(note["text"], n) for n, note in enumerate(data.distractors))
        superseded = apply_updates(store, data)
        stale = shown = first = 0
        for update in data.updates:
            hits = [h.item.content for h in store.search(update["question"], persona_id=READER)]
            stale += update["old"] in hits
            shown += update["new"] in hits
            first += bool(hits) and hits[0] == update["new"]
    total = len(data.updates)
    row(
        f"update pairs ({total}): superseded by the scripted extractor's operation",
        f"{superseded}/{total}",
        "before: 0 (nothing superseded)",
        f"{superseded / total:.0%}",
        "every pair",
    )
    row(
        f"update pairs ({total}): old fact still in the memory block",
        f"{stale}/{total}",
        "before: 11/32",
        f"{stale / total:.0%}",
        "0 stale",
    )
    row(
        f"update pairs ({total}): the new fact in the memory block",
        f"{shown}/{total}",
        "—",
        f"{shown / total:.0%}",
        "every pair",
    )
    row(
        f"update pairs ({total}): the new fact at rank 1",
        f"{first}/{total}",
        "before: 15/32",
        f"{first / total:.0%}",
        "every pair",
    )


def bench_duplicates(data: RecallSet) -> None:
    """The near-duplicate rule (`memory.lifecycle.duplicates`) on reworded pairs, update pairs and
    pairs of distinct facts."""
    embedding = MultilingualEmbedding()

    def caught(pairs: Iterable[tuple[str, str]]) -> tuple[int, int]:
        pairs = list(pairs)
        hits = sum(near_duplicate(cosines(embedding, a, [b])[0], a, b) for a, b in pairs)
        return hits, len(pairs)

    facts = [f["text"] for f in data.facts]
    for name, (hits, total), target in [
        ("reworded facts", caught((d["a"], d["b"]) for d in data.duplicates), "most"),
        ("update pairs", caught((u["old"], u["new"]) for u in data.updates), "none"),
        ("distinct facts (every pair)", caught(itertools.combinations(facts, 2)), "none"),
    ]:
        row(
            f"near-duplicates at cosine ≥ {DUPLICATE_COSINE} + same values: {name}",
            f"{hits}/{total}",
            "—",
            f"{hits / max(total, 1):.0%}",
            target,
        )


def scale_store(size: int, data: RecallSet) -> MemoryStore:
    """The cached `size`-item store of the default embedding (built on first use)."""
    embedding = MultilingualEmbedding()
    config = "-".join(str(v) for v in embedding.get_config().values())
    folder = CACHE / f"memory-{size}-{embedding.name()}-{config}"
    store = open_store(folder, embedding)
    if len(store.list()) == size:
        return store
    notes = [n["text"] for n in data.distractors]
    texts = [f"{a}；{b}" for a in notes for b in notes if a != b][:size]
    started = time.monotonic()
    for start in range(0, size, 5_000):
        store.add_many(item(text, n) for n, text in enumerate(texts[start : start + 5_000], start))
        print(f"  built {min(start + 5_000, size):,} of {size:,}", file=sys.stderr)
    print(f"  building took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return store


def bench_scale(size: int, data: RecallSet) -> None:
    """Search p50 / p95 at `size` items, the query's embedding included: wall time, and the
    process's CPU time (every thread's: the buckets are searched side by side), which a
    loaded machine inflates less; with the load average they were measured at."""
    with scale_store(size, data) as store:
        questions = [f["question"] for f in data.facts]
        store.search("warm-up", persona_id=READER)  # load the model, warm Chroma
        wall, cpu = [], []
        for question in questions:
            started = time.process_time()
            wall.append(elapsed_ms(lambda q=question: store.search(q, persona_id=READER)))
            cpu.append((time.process_time() - started) * 1000)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    row(
        f"memory search incl. query embedding, {size:,} items: p50 / p95 (ms), load {load}",
        f"{_percentiles(wall)}; CPU {_percentiles(cpu)}",
        "—",
        "—",
        "p95 ≤ 20 ms (idle machine)",
    )


def _percentiles(times: list[float]) -> str:
    ordered = sorted(times)
    return f"{statistics.median(ordered):.1f} / {ordered[int(0.95 * len(ordered))]:.1f}"


def bench_locomo() -> str:
    """LoCoMo retrieval rows (`tests.bench.locomo`) as a table; '' without the data."""
    from tests.bench.locomo import locomo_rows, store_rank_function
    from tests.bench.locomo_candidates import alone, lexical_side
    from tests.bench.locomo_old import old_store

    rows = locomo_rows(
        {
            "the store before issue 31 (USE top 32 re-ranked, relevance × decay)": old_store(),
            "BM25 alone (rank_bm25, `\\w+` words)": alone(lexical_side("rank_bm25 \\w+")),
            "the store's embedding alone (`Fusion(0, 1)`)": store_rank_function(
                {"fusion": DENSE_ONLY}
            ),
            "the store's default": store_rank_function(),
        }
    )
    if not rows:
        return ""
    cells: dict[str, dict[str, str]] = {}
    for name, clock, *recall, _ in rows:
        cells.setdefault(name, {})[clock] = " / ".join(recall)
    lines = [
        f"| LoCoMo, {rows[0][-1]} questions: R@1 / R@5 / R@10 | flat | dated |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {c['flat']} | {c['dated']} |" for name, c in cells.items()]
    return "\n".join(lines)


def recall_table(results: list[tuple[str, dict]]) -> str:
    head = "| embedding and ranking | " + " | ".join(
        f"{lang} recall@1 | {lang} recall@5 | {lang} MRR@10" for lang in LANGUAGES
    )
    lines = [head + " |", "|---" * (1 + 3 * len(LANGUAGES)) + "|"]
    for name, by_lang in results:
        cells = [f"{x:.2f}" for lang in LANGUAGES for x in by_lang[lang]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", action="store_true", help="also search at 100,000 items")
    parser.add_argument("--size", type=int, default=100_000)
    args = parser.parse_args()
    data = load_set()
    if args.scale:  # first: the recall runs would leave its questions' vectors cached
        bench_scale(args.size, data)
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_recall(Path(tmp), data)
        bench_updates(Path(tmp), data)
    bench_duplicates(data)
    locomo = bench_locomo()
    print(recall_table(results) + "\n")
    if locomo:
        print(locomo + "\n")
    print("| benchmark | ours | peer | ratio | target |\n|---|---|---|---|---|")
    for cells in ROWS:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
