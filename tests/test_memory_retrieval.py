"""Search with two candidate sources and one ranking (`memory.retrieval.lexical`,
`memory.retrieval.ranking`): age breaks ties only, the lexical index reaches every memory
the reader may read and no other, and it follows every change to the store.

Real embedded stores with the default embedding, on real dates.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory import Fusion, MemoryItem, MemoryStore, Scope, Source
from memory.retrieval import lexical, search
from memory.retrieval.aliases import alias_id

NOW = 1_900_000_000.0
DAY = 86_400.0
SECRET = "qzxjvwkbyf"


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    with MemoryStore.open(tmp_path / "memory", clock=lambda: NOW) as opened:
        yield opened


def note(text: str, days_old: float = 1, **owner: object) -> MemoryItem:
    return MemoryItem(content=text, created_at=NOW - days_old * DAY, **owner)  # type: ignore[arg-type]


def indexed(store: MemoryStore, words: str) -> list[str]:
    """The record ids the lexical index finds for `words`, in every bucket."""
    buckets = [str(c.metadata["bucket"]) for c in store._stored()]
    return [i for ids in store._lexical.search([words], buckets, 50).values() for i in ids]


# -- age never buries relevance ------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "fresh", "question"),
    [
        ("主人的护照号码是 E12345678", "主人今天去超市买了牛奶和面包", "我的护照号码是多少？"),
        (
            "The owner's passport number is E12345678",
            "The owner bought milk and bread at the shop today",
            "What is my passport number?",
        ),
    ],
)
def test_a_memory_180_days_old_that_answers_beats_a_fresh_one_that_does_not(
    store, answer, fresh, question
):
    store.add_many([note(answer, days_old=180), note(fresh, days_old=0)])
    first, *rest = store.search(question, k=2)
    assert first.item.content == answer
    assert first.decay == pytest.approx(0.2)  # the floor: 6 half-lives old
    # The documented rule: relevance over the best candidate's, plus 0.01 × decay.
    top = max(r.relevance for r in [first, *rest])
    for result in [first, *rest]:
        assert result.score == pytest.approx(result.relevance / top + 0.01 * result.decay)


def test_age_still_orders_memories_equally_relevant(store):
    store.add_many([note("主人喜欢猫", days_old=90, kind="old"), note("主人喜欢猫", kind="new")])
    assert [r.item.kind for r in store.search("主人喜欢猫", k=2)] == ["new", "old"]


def test_age_breaks_a_near_tie_even_when_one_memory_is_asked_for(store):
    # A search reads Chroma for the most relevant memories first (`Search._best`): the
    # older one here, 0.988 relevant against 0.984; it must read the fresher one too.
    older, fresher = note("主人喜欢猫。", days_old=90), note("主人喜欢猫咪")
    store.add_many([older, fresher])
    first, second = store.search("主人喜欢猫", k=2)
    assert (first.item.content, second.item.content) == (fresher.content, older.content)
    assert first.relevance < second.relevance
    assert [r.item.content for r in store.search("主人喜欢猫", k=1)] == [fresher.content]


# -- two candidate sources -------------------------------------------------------------------


def test_the_lexical_side_finds_what_the_dense_pool_misses(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "_POOL", 2)
    crowd = [note(f"主人的朋友{n}号喜欢在周末喝乌龙茶") for n in range(40)]
    target = note(f"主人的储物柜暗号是 {SECRET}")
    asked = f"主人周末喝茶的暗号 {SECRET}"
    with MemoryStore.open(tmp_path / "dense", fusion=Fusion(0, 1), clock=lambda: NOW) as dense:
        dense.add_many([*crowd, target])
        assert target.content not in [r.item.content for r in dense.search(asked, k=1)]
    with MemoryStore.open(tmp_path / "both", clock=lambda: NOW) as both:
        both.add_many([*crowd, target])
        assert both.search(asked, k=1)[0].item.content == target.content


def test_restricted_reads_never_get_persona_memories_through_the_lexical_side(store, monkeypatch):
    private = note(f"希莲的秘密是 {SECRET}", scope=Scope.PERSONA, persona_id="xilian")
    shared = note("主人喜欢乌龙茶", scope=Scope.USER)
    store.add_many([private, shared])
    assert private.id in indexed(store, SECRET)  # the index holds it ...
    asked: list[list[str]] = []
    real = store._lexical.search

    def spy(readings, buckets, n):
        asked.append(list(buckets))
        return real(readings, buckets, n)

    monkeypatch.setattr(store._lexical, "search", spy)
    for reader in ("xilian", None):
        found = store.search(SECRET, persona_id=reader, restricted=True, k=8)
        assert private.content not in [r.item.content for r in found]  # ... but never hands it
    assert asked == [["user", "project"]] * 2 or all(
        not any(b.startswith("persona_") for b in buckets) for buckets in asked
    )
    other = store.search(SECRET, persona_id="aglaea", k=8)
    assert private.content not in [r.item.content for r in other]
    own = store.search(SECRET, persona_id="xilian", k=8)
    assert own[0].item.content == private.content


def _idf(term: str) -> float:
    # "kiwi fig" reads as kiwi, kiw, iwi, fig: a memory holding "fig" alone covers 1/5.
    return 1.0 if term == "fig" else 4 / 3


def test_a_shared_word_leads_only_when_the_embedding_finds_the_question_close():
    """`Fusion`: coverage counts in proportion to the nearest candidate's cosine. The fig
    note shares a word with the question but is far from it; the other note is nearer."""
    fusion = Fusion()
    documents = ["a fig on the shelf", "something else entirely"]
    assert fusion.relevances(["kiwi fig"], documents, [0.9, 0.7], _idf) == pytest.approx(
        [(0.7 * 0.3 * 0.2 + 0.3 * 0.1 + 0.5 * 0.2 * 0.1) / 1.5, 0.3 * 0.3 / 1.5]
    ), "far from every memory (best cosine 0.3): the nearer note leads"
    shared, nearer = fusion.relevances(["kiwi fig"], documents, [0.5, 0.3], _idf)
    assert shared > nearer, "close (best cosine 0.7): the shared word leads"
    alone = Fusion(0, 1).relevances(["kiwi fig"], documents, [0.9, 0.7], _idf)
    assert alone == pytest.approx([0.1, 0.3]), "dense alone: the cosine"


_LETTERS = st.sampled_from(list("abcdeßİ主人喜欢猫的 ,.!?'_-0123ΣσςÅ\u0301"))


@settings(max_examples=500, deadline=None)
@given(st.text(_LETTERS, max_size=30), st.text(_LETTERS, max_size=30))
def test_the_fusion_finds_a_memory_s_terms_as_the_index_reads_them(memory, question):
    """Coverage checks the question's terms against each candidate without listing the
    candidate's own terms (`lexical.Held`): it must find exactly those the index reads."""
    wanted = {*lexical.terms(question), *lexical.terms(memory[2:9])}
    assert lexical.Held(wanted)(memory) == wanted & set(lexical.terms(memory))


# -- the index follows the store -------------------------------------------------------------


def test_the_index_follows_writes_supersedes_forgets_and_prunes(store):
    old = note(f"主人的储物柜暗号是 {SECRET}")
    store.add(old)
    assert indexed(store, SECRET) == [old.id]
    new = note("主人的储物柜暗号改成了 plumtree")
    store.supersede(old.id, new)
    # The old words stay as the new memory's alias (`memory.retrieval.aliases`), and find it.
    assert indexed(store, SECRET) == [alias_id(old.id)]
    assert indexed(store, "plumtree") == [new.id]
    assert store.search(SECRET, k=1)[0].item.id == new.id
    store.forget(new.id)
    assert indexed(store, SECRET) == [] and indexed(store, "plumtree") == []
    extracted = note("主人的车牌是 京A12345", source=Source(extraction="run-1"))
    store.add(extracted)
    assert store.prune_extractions({"run-1": set()}) == 1
    assert indexed(store, "京A12345") == []


def test_the_idf_the_fusion_reads_follows_writes_and_removals():
    """IDF is kept between writes (a search asks ~40 terms of every shard); a write or a
    removal must be seen by the next search."""
    index = lexical.LexicalIndex()
    index.put("user", ["a", "b", "c"], ["cat sat", "dog ran", "bird flew"])
    once = index.idf("cat")
    index.put("persona:xilian", ["d"], ["a cat again"])
    twice = index.idf("cat")
    assert twice < once
    index.remove(["d"])
    assert index.idf("cat") == pytest.approx(once)


def test_the_index_is_rebuilt_from_the_store_on_open_and_writes_no_file(tmp_path):
    folder = tmp_path / "memory"
    with MemoryStore.open(folder, clock=lambda: NOW) as first:
        first.add(note(f"主人的储物柜暗号是 {SECRET}"))
    with MemoryStore.open(folder, clock=lambda: NOW) as again:
        assert len(indexed(again, SECRET)) == 1
        assert again.reindex(everything=True) == 1
        assert len(indexed(again, SECRET)) == 1
    # Chroma's text is sealed, and the index lives in memory: no file holds the word.
    blob = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    assert SECRET.encode() not in blob


def test_another_handle_s_writes_and_forgets_are_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(lexical, "_RECHECK", 0.0)
    folder = tmp_path / "memory"
    with (
        MemoryStore.open(folder, clock=lambda: NOW) as reader,
        MemoryStore.open(folder, clock=lambda: NOW) as writer,
    ):
        reader.add(note("主人喜欢乌龙茶"))  # the bucket exists for both
        secret = note(f"主人的储物柜暗号是 {SECRET}")
        writer.add(secret)
        assert reader.search(SECRET, k=1)[0].item.id == secret.id
        assert secret.id in indexed(reader, SECRET)
        writer.forget(secret.id)
        reader.search(SECRET, k=1)
        assert indexed(reader, SECRET) == []


@pytest.mark.services
def test_workers_on_one_chroma_server_follow_each_other(chroma_server, monkeypatch):
    monkeypatch.setattr(lexical, "_RECHECK", 0.0)
    reader = MemoryStore.connect(port=chroma_server, clock=lambda: NOW)
    writer = MemoryStore.connect(port=chroma_server, clock=lambda: NOW)
    try:
        secret = note(f"主人的储物柜暗号是 {SECRET} 号")
        writer.add(secret)
        assert reader.search(SECRET, k=1)[0].item.id == secret.id
        assert secret.id in indexed(reader, SECRET)
        writer.forget(secret.id)
        assert secret.id not in [r.item.id for r in reader.search(SECRET, k=1)]
        assert secret.id not in indexed(reader, SECRET)
    finally:
        reader.close()
        writer.close()


def test_a_record_it_cannot_read_does_not_send_the_index_back_to_chroma(tmp_path, monkeypatch):
    monkeypatch.setattr(lexical, "_RECHECK", 0.0)
    folder = tmp_path / "memory"
    with MemoryStore.open(folder, clock=lambda: NOW) as first:
        lost, kept = note("主人的旧暗号"), note(f"主人的储物柜暗号是 {SECRET}")
        first.add_many([lost, kept])
        first._documents.forget([lost.id])  # its key gone, its record still there
    with MemoryStore.open(folder, clock=lambda: NOW) as again:
        caught_up: list[object] = []
        real = again._lexical._catch_up
        monkeypatch.setattr(again._lexical, "_catch_up", lambda *a: caught_up.append(a) or real(*a))
        for _ in range(3):
            assert again.search(SECRET, k=1)[0].item.id == kept.id
        assert caught_up == []


def test_a_search_beside_writes_in_another_thread_reads_its_own_hits():
    """Conversation recall writes its index from a background thread while rounds search it:
    a search must read its hits' ids from the searcher that found them, never from the one
    a commit in between put in its place (tantivy panicked: index out of bounds)."""
    index = lexical.LexicalIndex()
    index.put("owner", ["m0"], ["今天过得怎么样"])
    stop, failures = threading.Event(), []

    def write() -> None:
        n = 1
        while not stop.is_set():
            index.put("owner", [f"m{n}"], [f"第{n}句：今天过得怎么样？"])
            if n % 3 == 0:  # removals let tantivy merge segments: fewer than a search saw
                index.remove([f"m{n - 1}"])
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3000):
            try:
                found = index.search(["今天过得怎么样"], ["owner"], 32)
            except BaseException as error:  # pyo3's PanicException is a BaseException
                failures.append(error)
                break
            assert found["owner"], "every search finds the first record at least"
    finally:
        stop.set()
        writer.join()
    assert failures == []
