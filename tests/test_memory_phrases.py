"""A forget or a correction names what it changes (issue 29, finding 2).

`tests/data/memory_phrases.jsonl`: a store of eleven facts (Chinese and English),
then 72 things an owner says — forgets and corrections that name a stored fact,
vague ones ("忘掉吧，没什么", "forget that, never mind", "更正一下"), ones that name
a fact never stored, idioms and near-misses ("别忘了", "我差点忘掉"), and "记住"
forms, statements and questions. Each is planned by the real pipeline
(`plan_extraction`: the store's recall, the extractor, the duplicate check) with
`ManualExtractor`, against the default embedding. The bar: 0 wrong erasures (a
forget or supersede of anything the phrase does not name), 0 junk memories, and
every phrase that names a fact changes that fact.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from graph import LLMExtractor, ManualExtractor
from memory import MemoryItem, MemoryStore, Scope, Source
from nodes.extraction.extractors import MemoryOperation, MemoryOperations
from nodes.extraction.planning import plan_extraction
from tests.scripted import Request, ScriptedChatModel

PHRASES = Path(__file__).parent / "data" / "memory_phrases.jsonl"


def load() -> tuple[list[str], list[dict]]:
    lines = [json.loads(line) for line in PHRASES.read_text().splitlines() if line.strip()]
    return lines[0]["memories"], lines[1:]


MEMORIES, CASES = load()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with MemoryStore.open(tmp_path_factory.mktemp("phrases")) as opened:
        opened.add_many(
            MemoryItem(content=text, kind="fact", scope=Scope.USER) for text in MEMORIES
        )
        yield opened


def outcome(store: MemoryStore, said: str) -> tuple[str, str | None, str | None]:
    """(what the pipeline would do, to which stored fact, with what new text)."""
    changes = plan_extraction(
        ManualExtractor(scope=Scope.USER),
        [HumanMessage(said)],
        store,
        persona_id="xilian",
        source=Source(session_id="s", message_id="m"),
    )
    if not changes:
        return "none", None, None
    [change] = changes
    target = store.get(change.target).content if change.target else None
    return change.action, target, change.item.content if change.item else None


def test_every_phrase_changes_only_what_it_names(store):
    wrong, tally = [], Counter()
    for case in CASES:
        got = outcome(store, case["say"])
        expected = (case["expect"], case.get("target"), case.get("content"))
        if got[0] == "add" and expected[0] == "add":
            expected = (expected[0], None, expected[2])
        tally[(case["expect"], got == expected)] += 1
        if got != expected:
            wrong.append((case["say"], expected, got))
    erasures = [w for w in wrong if w[2][0] in ("forget", "supersede")]
    junk = [w for w in wrong if w[2][0] == "add"]
    print(f"\n{len(CASES)} phrases; by expected outcome (correct, wrong): {dict(tally)}")
    assert not erasures, f"{len(erasures)} wrong erasures: {erasures}"
    assert not junk, f"{len(junk)} junk memories: {junk}"
    assert not wrong, f"{len(wrong)} phrases missed what they named: {wrong}"


# -- a model's forget names what it changes too ---------------------------------------


class Forgetful(ScriptedChatModel):
    """A model that answers every extraction with "forget memory 1" (a careless one)."""

    def bind_tools(self, tools, **kwargs):
        return self

    def with_structured_output(self, schema, **kwargs):
        outer = self

        class Structured:
            def invoke(self, messages):
                outer._requests.append(Request(list(messages), {}))
                return MemoryOperations(operations=[MemoryOperation(op="forget", handle=1)])

        return Structured()


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        ("forget that, never mind", True),
        ("忘掉吧，没什么", True),
        ("忘掉我的银行卡密码", False),
    ],
)
def test_a_models_forget_of_a_memory_the_words_do_not_name_is_refused(store, said, kept):
    model = Forgetful()
    card = next(m for m in store.list() if "银行卡" in m.content)
    changes = plan_extraction(
        LLMExtractor(model, background=False),
        [HumanMessage(said)],
        store,
        persona_id="xilian",
        source=Source(session_id="s", message_id="m"),
    )
    prompt = model.requests[0].messages[0].content
    assert "没有说是哪条的话" in prompt and "问句不是事实" in prompt, "the prompt states the rule"
    targets = [c.target for c in changes if c.action == "forget"]
    if kept:
        assert targets == [], "the loop refuses a forget the message does not name"
    else:
        assert targets == [card.id]
