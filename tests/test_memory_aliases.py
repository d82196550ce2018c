"""A superseded fact's words still find what replaced it (`memory.retrieval.aliases`), and nothing else.

Real embedded stores with the default embedding; supersedes go through the store's own
`supersede` (the extraction path is covered by test_memory_lifecycle).
"""

from __future__ import annotations

import threading
import time

import pytest

from memory import (
    HashingEmbedding,
    MemoryItem,
    MemoryStore,
    MultilingualEmbedding,
    Scope,
    Source,
)
from memory.storage.records import ALIAS_OF
from nodes.extraction.planning import recall
from tests.conftest import human

DAY = 86_400.0
NOW = 1_900_000_000.0
OLD = "主人用的是联通的手机卡"
NEW = "主人已经把手机号转到了移动"
ASKED_THE_OLD_WAY = "我的手机卡是联通的吗？"


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    with MemoryStore.open(tmp_path / "memory", clock=lambda: NOW) as opened:
        yield opened


def fact(text: str, scope: Scope = Scope.USER, persona_id: str | None = None) -> MemoryItem:
    return MemoryItem(content=text, scope=scope, persona_id=persona_id, created_at=NOW - DAY)


def found(store: MemoryStore, query: str) -> list[str]:
    return [hit.item.content for hit in store.search(query, persona_id="xilian")]


def test_asking_in_the_old_facts_words_finds_the_new_fact_and_never_the_old(store):
    old = fact(OLD)
    store.add(old)
    store.add_many(fact(f"手机壳第{n}号款式有货了") for n in range(20))
    assert store.supersede(old.id, fact(NEW))
    hits = found(store, ASKED_THE_OLD_WAY)
    assert hits[0] == NEW and OLD not in hits
    assert [
        i.content for i in store.list() if "手机" in i.content and "号款式" not in i.content
    ] == [NEW]
    assert store.get(old.id) is None
    assert store.history(old.id)[0].state == "superseded"


def test_the_words_of_a_chain_follow_it_to_its_newest_fact(store):
    first, second, third = fact("主人住在北京"), fact("主人搬到了上海"), fact("主人现在住在深圳")
    store.add(first)
    store.supersede(first.id, second)
    store.supersede(second.id, third)
    for question in ("我住在北京吗？", "我住在上海吗？", "我现在住哪？"):
        hits = found(store, question)
        assert hits == ["主人现在住在深圳"], question
    [record] = [c for c in store._stored() if c.count()]
    aliases = record.get(where={ALIAS_OF: third.id}, include=["documents"])
    words = store._documents.unseal(aliases["ids"], aliases["documents"])  # sealed text
    assert sorted(words) == sorted(["主人住在北京", "主人搬到了上海"])


def test_forgetting_takes_the_words_too(store, tmp_path):
    old, new = fact("主人的门禁密码是四四五五"), fact("主人的门禁密码改成了六六七七")
    store.add(old)
    store.supersede(old.id, new)
    assert store.forget(new.id)
    assert found(store, "门禁密码是四四五五吗") == [] and store.list() == []
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "memory").rglob("*") if p.is_file())
    assert "四四五五".encode() not in on_disk and "六六七七".encode() not in on_disk


def test_a_successor_in_another_bucket_gets_no_alias(store):
    """A persona's private words must not sit in the shared index, even as an alias."""
    private = fact("主人只跟希里安说过自己怕黑", Scope.PERSONA, "xilian")
    store.add(private)
    store.supersede(private.id, fact("主人已经不怕黑了"))
    restricted = store.search("怕黑", restricted=True)
    assert [h.item.content for h in restricted] == ["主人已经不怕黑了"]
    for collection in store._stored():
        metadatas = collection.get(include=["metadatas"])["metadatas"]
        assert not [m for m in metadatas if ALIAS_OF in (m or {})], collection.name


def test_restating_the_old_fact_is_stored_again_not_a_duplicate_of_its_successor(store):
    old = fact("主人每天开车上班")
    store.add(old)
    new = fact("主人现在改坐地铁通勤了")
    store.supersede(old.id, new)
    assert [item.id for item, _ in store.nearest("主人每天开车上班")] == [new.id]
    assert all(cosine < 0.86 for _, cosine in store.nearest("主人每天开车上班"))
    assert store.nearest("主人每天开车上班", min_cosine=0.86) == []
    assert [i.id for i, _ in store.nearest("主人现在改坐地铁通勤了", min_cosine=0.86)] == [new.id]


def test_the_extractor_is_shown_an_old_fact_that_fresher_notes_would_bury(store):
    """`recall` ranks by relevance alone: age decay would put a month of fresh notes first."""
    store.add(
        MemoryItem(content="The owner runs 5 km three times a week", created_at=NOW - 90 * DAY)
    )
    store.add_many(
        MemoryItem(content=text, created_at=NOW - DAY)
        for text in [f"The {n}th soccer match was postponed due to rain" for n in range(30)]
    )
    statement = human("The owner now cycles instead of running because of a knee injury")
    shown = [r.item.content for r in recall(store, [statement], "xilian")]
    assert "The owner runs 5 km three times a week" in shown


def test_aliases_are_re_embedded_with_their_bucket(tmp_path):
    with MemoryStore.open(tmp_path / "m", HashingEmbedding(), clock=lambda: NOW) as lexical:
        old = fact(OLD)
        lexical.add(old)
        lexical.supersede(old.id, fact(NEW))
    with MemoryStore.open(tmp_path / "m", MultilingualEmbedding(), clock=lambda: NOW) as store:
        assert found(store, ASKED_THE_OLD_WAY)[0] == NEW


def test_a_successor_pruned_after_a_crash_takes_its_aliases(store):
    """A re-run extraction deletes what an earlier run stored beyond its own items; the
    words such a memory held as aliases go with it."""
    old = fact("主人每天开车上班")
    store.add(old)
    new = fact("主人现在改坐地铁通勤了").model_copy(update={"source": Source(extraction="run-1")})
    store.supersede(old.id, new)
    assert store.prune_extractions({"run-1": set()}) == 1
    assert found(store, "我每天开车上班吗？") == []
    for collection in store._stored():
        metadatas = collection.get(include=["metadatas"])["metadatas"]
        assert not [m for m in metadatas if ALIAS_OF in (m or {})], collection.name


def test_superseding_a_memory_with_its_own_id_rewrites_it(store):
    """A re-run extraction's fact has the id of its earlier run's: superseding that one with
    it rewrites the record; it must not delete what it just wrote."""
    first = fact("主人的航班是明早七点").model_copy(update={"id": "run-item-0"})
    store.add(first)
    again = fact("主人的航班是明早八点").model_copy(update={"id": "run-item-0"})
    assert store.supersede("run-item-0", again)
    assert [i.content for i in store.list()] == ["主人的航班是明早八点"]
    assert found(store, "我的航班几点？") == ["主人的航班是明早八点"]


def test_ids_of_the_aliases_namespace_are_refused_at_the_boundary(store):
    with pytest.raises(ValueError, match="the store's own"):
        MemoryItem(content="主人的护照号码是E12345678", id="alias:whatever")


def test_a_forget_during_a_supersede_leaves_no_words_behind(tmp_path):
    """supersede holds the store while it works, so a forget of the same memory comes
    before or after it, never between its steps (which brought the text back as an alias)."""

    class SlowWrites(MemoryStore):
        def _write(self, items):
            time.sleep(0.3)
            return super()._write(items)

    with SlowWrites.open(tmp_path / "memory", clock=lambda: NOW) as store:
        secret = fact("主人的银行卡密码是七七八八")
        store.add(secret)
        replacing = threading.Thread(
            target=store.supersede, args=(secret.id, fact("主人换了一张新银行卡"))
        )
        replacing.start()
        time.sleep(0.1)
        assert store.forget(secret.id)
        replacing.join()
        assert found(store, "银行卡密码是七七八八吗") in ([], ["主人换了一张新银行卡"])
        for collection in store._stored():
            got = collection.get()
            assert "主人的银行卡密码是七七八八" not in store._documents.unseal(
                got["ids"], got["documents"]
            )
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "memory").rglob("*") if p.is_file())
    assert "七七八八".encode() not in on_disk


def test_forgetting_a_fact_leaves_a_replaced_fact_stated_again_since(store):
    """A → B, then A is said again (live again), then B is forgotten: A stays, whole."""
    a, b = fact("主人住在北京"), fact("主人搬到了上海")
    store.add(a)
    store.supersede(a.id, b)
    store.add(a)
    assert store.forget(b.id)
    assert [i.content for i in store.list()] == ["主人住在北京"]
    assert store.history(a.id)[-1].state == "live"
    assert found(store, "我住在哪？") == ["主人住在北京"]


def test_aliases_never_crowd_a_live_memory_out_of_the_nearest(store):
    """`nearest` reads more rows while aliases fill those it read."""
    live = fact("主人很喜欢喝冰美式咖啡")
    store.add(live)
    asked = "主人最喜欢的饮料是冰美式咖啡"
    variants = [asked + mark for mark in "。！～…!?.,；：、~"] + [
        mark + asked for mark in "“「（【《"
    ]
    previous = fact(variants[0])
    store.add(previous)
    for text in variants[1:]:
        following = fact(text)
        store.supersede(previous.id, following)
        previous = following
    store.supersede(previous.id, fact("主人已经戒掉了所有含咖啡因的饮料"))
    assert [i.content for i, _ in store.nearest(asked, k=1)] == ["主人很喜欢喝冰美式咖啡"]
    close = store.nearest(asked, k=1, min_cosine=0.86)
    assert [i.content for i, _ in close] == ["主人很喜欢喝冰美式咖啡"]
