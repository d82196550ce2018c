"""Memory scopes that cannot collide, writes that lose nothing, and the store's lifecycle."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time

import chromadb
import pytest
from chromadb.config import Settings
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage

from graph import LLMExtractor, ManualExtractor, Persona, SessionEnv, build_graph
from memory import (
    Extractor,
    FindsNeighbours,
    HashingEmbedding,
    MemoryBackend,
    MemoryItem,
    MemoryStore,
    MemoryStoreError,
    MemoryWriteError,
    Scope,
    Source,
    StoreLayoutError,
)
from memory.storage.layout import collection_name
from tests.conftest import human, make_config, thread
from tests.scripted import ScriptedChatModel

SECRET_PERSONA = "秘密人格"
LOOKALIKE = "xc67164fe21a1db39121d8617"  # the name the old layout gave 秘密人格's collection
DIARY = "秘密人格的日记：主人今天哭了"
CHROMA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$")


def legal(name: str) -> bool:
    """Chroma's collection-name rules (checked against chromadb 1.5: see test below)."""
    return bool(CHROMA_NAME.match(name)) and ".." not in name


# -- collection names --------------------------------------------------------------

lookalikes = st.builds(
    lambda prefix, body: prefix + body,
    st.sampled_from(["", "x", "-", ".", "_", "persona_", "persona-", "persona.", "xc"]),
    st.text(alphabet="0123456789abcdef", min_size=1, max_size=70),
)
persona_ids = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet="abcXYZ019._-", min_size=1, max_size=40),
    lookalikes,
    st.text(alphabet="ab", min_size=500, max_size=520),
    st.text(alphabet="秘密人格", min_size=80, max_size=90),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(persona_ids, unique=True, min_size=1, max_size=8))
def test_collection_names_are_injective_and_chroma_legal(ids):
    buckets = ["user", "project", *(f"persona_{i}" for i in ids)]
    names = [collection_name(b) for b in buckets]
    assert len(set(names)) == len(buckets), dict(zip(buckets, names, strict=True))
    assert all(legal(n) for n in names), names


def test_the_name_rules_match_chroma(tmp_path):
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    extremes = ["a", "a" * 504, "a" * 505, "秘" * 84, "秘" * 85, "😀", "a..b", "-x-", "\ud800"]
    for persona in extremes:
        name = collection_name(f"persona_{persona}")
        assert legal(name)
        client.get_or_create_collection(name)  # raises when Chroma disagrees
    for bad in ("ab", "a..b", "-ab", "ab-", "a" * 513):
        assert not legal(bad)
        with pytest.raises(Exception, match="name"):
            client.create_collection(bad)


def test_the_issue_collision_cannot_happen(tmp_path):
    """Issue 12 #3: persona "秘密人格" and persona "xc67164fe21a1db39121d8617" shared a collection."""
    store = MemoryStore.open(tmp_path / "m")
    store.add(
        MemoryItem(content=DIARY, kind="diary", scope=Scope.PERSONA, persona_id=SECRET_PERSONA)
    )
    assert collection_name(f"persona_{SECRET_PERSONA}") != collection_name(f"persona_{LOOKALIKE}")
    assert store.search("秘密人格的日记", persona_id=LOOKALIKE, k=10) == []
    assert store.list(persona_id=LOOKALIKE) == []
    assert [r.item.content for r in store.search("日记", persona_id=SECRET_PERSONA)] == [DIARY]

    personas = {
        SECRET_PERSONA: Persona(name="秘密", instructions="你是秘密。"),
        LOOKALIKE: Persona(name="像", instructions="你是像。"),
    }
    model = ScriptedChatModel(script=[AIMessage("嗯"), AIMessage("嗯")])
    graph = build_graph(
        make_config(model, memory=store, personas=personas, default_persona=SECRET_PERSONA)
    )
    for persona in (LOOKALIKE, SECRET_PERSONA):
        graph.invoke(
            {"messages": [human("秘密人格的日记写了什么？")]},
            thread(persona),
            context=SessionEnv(persona_id=persona),
        )
    lookalike_view, secret_view = (str([m.content for m in r.messages]) for r in model.requests)
    assert DIARY not in lookalike_view and DIARY in secret_view


def test_a_long_persona_id_gets_a_checked_hashed_collection(tmp_path):
    long_id = "很长的人格名" * 50  # 900 bytes: too long to spell out in a collection name
    store = MemoryStore.open(tmp_path / "m")
    store.add(MemoryItem(content="长名字人格的日记", scope=Scope.PERSONA, persona_id=long_id))
    assert [r.item.content for r in store.search("日记", persona_id=long_id)] == [
        "长名字人格的日记"
    ]
    # A different id whose name hashed the same would find a collection recording another owner:
    impostor = store.client.get_collection(collection_name(f"persona_{long_id}"))
    impostor.modify(metadata={"bucket": "persona_别人", "layout": 2})
    store.close()
    with MemoryStore.open(tmp_path / "m") as again, pytest.raises(StoreLayoutError, match="别人"):
        again.search("日记", persona_id=long_id)


def legacy_store(path) -> None:
    """A store as the old layout wrote it: 秘密人格 in `persona_x<sha24>`, shared with LOOKALIKE."""
    legacy_name = (
        "persona_x" + hashlib.sha256(f"persona_{SECRET_PERSONA}".encode()).hexdigest()[:24]
    )
    assert legacy_name == f"persona_{LOOKALIKE}", "the issue's example reproduces"
    client = chromadb.PersistentClient(
        path=str(path), settings=Settings(anonymized_telemetry=False)
    )
    embed = HashingEmbedding()

    def write(name: str, bucket: str, items: list[MemoryItem]) -> None:
        collection = client.get_or_create_collection(
            name,
            embedding_function=embed,
            metadata={"bucket": bucket},
            configuration={"hnsw": {"space": "cosine"}},
        )
        collection.upsert(
            ids=[i.id for i in items],
            documents=[i.content for i in items],
            metadatas=[i.metadata() for i in items],
        )

    diary = MemoryItem(content=DIARY, kind="diary", scope=Scope.PERSONA, persona_id=SECRET_PERSONA)
    own = MemoryItem(
        content="像的日记：今天很平静", kind="diary", scope=Scope.PERSONA, persona_id=LOOKALIKE
    )
    xilian = MemoryItem(
        content="昔涟的日记：看了日落", kind="diary", scope=Scope.PERSONA, persona_id="xilian"
    )
    tea = MemoryItem(content="主人喜欢喝乌龙茶", kind="habit", scope=Scope.USER)
    write(legacy_name, f"persona_{SECRET_PERSONA}", [diary, own])  # the collided collection
    alone = MemoryItem(
        content="昔涟的私密日记", kind="diary", scope=Scope.PERSONA, persona_id="昔涟"
    )
    alone_name = "persona_x" + hashlib.sha256("persona_昔涟".encode()).hexdigest()[:24]
    write(alone_name, "persona_昔涟", [alone])  # a hashed collection only its persona used
    write("persona_xilian", "persona_xilian", [xilian])
    write("user", "user", [tea])
    client.close()


def test_a_legacy_store_is_migrated_on_open(tmp_path):
    legacy_store(tmp_path / "m")
    for _ in range(2):  # migrating twice changes nothing
        store = MemoryStore.open(tmp_path / "m")
        assert [r.item.content for r in store.search("日记", persona_id=LOOKALIKE, k=10)] == [
            "像的日记：今天很平静"
        ]
        assert [r.item.content for r in store.search("日记", persona_id=SECRET_PERSONA, k=10)] == [
            DIARY
        ]
        assert [r.item.content for r in store.search("日记", persona_id="xilian", k=10)] == [
            "昔涟的日记：看了日落"
        ]
        assert [r.item.content for r in store.search("日记", persona_id="昔涟", k=10)] == [
            "昔涟的私密日记"
        ]
        assert len(store.list()) == 5, "nothing is lost by the migration"
        names = {c.name for c in store.client.list_collections()}
        assert {collection_name(f"persona_{p}") for p in (SECRET_PERSONA, "昔涟")} <= names
        assert not any(
            re.fullmatch(r"persona_x[0-9a-f]{24}", n) for n in names - {f"persona_{LOOKALIKE}"}
        )
        store.close()


def test_search_drops_a_hit_stored_under_another_persona(tmp_path):
    """The second guard: even a record in the wrong collection never reaches the wrong reader."""
    store = MemoryStore.open(tmp_path / "m")
    store.add(
        MemoryItem(content="昔涟的日记", kind="diary", scope=Scope.PERSONA, persona_id="xilian")
    )
    store.add(MemoryItem(content="主人的日记本是蓝色的", kind="habit", scope=Scope.USER))
    stray = MemoryItem(
        content="阿格莱雅的日记", kind="diary", scope=Scope.PERSONA, persona_id="aglaea"
    )
    for bucket in ("persona_xilian", "user"):
        store.client.get_collection(collection_name(bucket)).upsert(
            ids=[f"stray-{bucket}"], documents=[stray.content], metadatas=[stray.metadata()]
        )
    seen = {r.item.content for r in store.search("日记", persona_id="xilian", k=10)}
    assert seen == {"昔涟的日记", "主人的日记本是蓝色的"}
    for persona, restricted in ((None, False), ("xilian", True), ("aglaea", True)):
        hits = store.search("日记", persona_id=persona, restricted=restricted, k=10)
        assert [r.item.content for r in hits] == ["主人的日记本是蓝色的"]


# -- items at the boundary ------------------------------------------------------------


def test_lone_surrogates_become_replacement_characters(tmp_path):
    item = MemoryItem(
        content="主人喜欢\ud83d猫",
        kind="ha\udc00bit",
        scope=Scope.PERSONA,
        persona_id="昔\ud800",
        source=Source(session_id="s\udfff", message_id="m"),
    )
    assert (item.content, item.kind, item.persona_id, item.source.session_id) == (
        "主人喜欢\ufffd猫",
        "ha\ufffdbit",
        "昔\ufffd",
        "s\ufffd",
    )
    store = MemoryStore.open(tmp_path / "m")
    store.add(item)
    assert store.get(item.id) == item
    [hit] = store.search("主人喜欢\udc00猫", persona_id="昔\ud800")
    assert hit.item.content == "主人喜欢\ufffd猫"


def test_an_item_read_back_equals_the_one_stored_to_the_last_digit(tmp_path):
    item = MemoryItem(content="主人喜欢猫", created_at=1796006634.5940707)  # Chroma returned …071
    store = MemoryStore.open(tmp_path / "m")
    store.add(item)
    assert store.get(item.id) == item


def test_one_strip_and_reject_rule_for_content_and_kind():
    item = MemoryItem(content="  喜欢猫 \n", kind=" habit ")
    assert (item.content, item.kind) == ("喜欢猫", "habit")
    for field in ("content", "kind"):
        with pytest.raises(ValueError, match=f"{field}: must not be empty"):
            MemoryItem(**{"content": "x", field: " \u3000\n"})


# -- writes that lose nothing ---------------------------------------------------------


def test_a_batch_with_repeats_is_stored_once_and_the_last_copy_wins(tmp_path):
    store = MemoryStore.open(tmp_path / "m")
    first = MemoryItem(content="主人喜欢猫", scope=Scope.USER, created_at=1.0)
    other = MemoryItem(content="主人喜欢狗", scope=Scope.USER, created_at=1.0)
    last = MemoryItem(content="主人喜欢猫", scope=Scope.USER, created_at=2.0)
    ids = store.add_many([first, other, last])
    assert ids == [first.id, other.id, first.id]
    assert sorted((i.content, i.created_at) for i in store.list()) == [
        ("主人喜欢狗", 1.0),
        ("主人喜欢猫", 2.0),
    ]


class LimitedEmbedding(HashingEmbedding):
    """An embedder with an input limit, as hosted embedding models have (token limits)."""

    def __call__(self, input):
        if any(len(text) > 100 for text in input):
            raise ValueError("input too long for this embedding model")
        return super().__call__(input)


def test_one_bad_item_never_loses_the_others(tmp_path, caplog):
    store = MemoryStore.open(tmp_path / "m", embedding_function=LimitedEmbedding())
    good = [MemoryItem(content=f"主人的第{n}件事", scope=Scope.USER) for n in range(3)]
    bad = MemoryItem(content="长" * 200, scope=Scope.USER)
    with (
        caplog.at_level(logging.WARNING, logger="cyrene.memory"),
        pytest.raises(MemoryWriteError, match="1 of 4 memories could not be stored") as raised,
    ):
        store.add_many([good[0], bad, *good[1:]])
    assert [item.id for item, _ in raised.value.failed] == [bad.id]
    assert raised.value.stored == [g.id for g in good]
    assert sorted(i.content for i in store.list()) == sorted(g.content for g in good)
    assert store.failed_writes == 1 and "input too long" in caplog.text


# -- lifecycle and contracts ----------------------------------------------------------


def memory_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("cyrene-memory")]


def test_close_releases_the_pool_and_the_store_is_a_context_manager(tmp_path):
    before = set(memory_threads())  # other tests' stores may still hold (or drop) theirs
    with MemoryStore.open(tmp_path / "m") as store:
        store.add(MemoryItem(content="主人喜欢猫", scope=Scope.USER))
        store.add(MemoryItem(content="昔涟喜欢猫", scope=Scope.PERSONA, persona_id="xilian"))
        assert store.search("猫", persona_id="xilian", k=2)
        ours = set(memory_threads()) - before
        assert ours, "a search runs on the store's own threads"
    assert not any(t.is_alive() for t in ours), "close() joined the search threads"
    with pytest.raises(MemoryStoreError, match="closed"):
        store.search("猫")
    store.close()  # closing twice is harmless
    with MemoryStore.open(tmp_path / "m") as again:
        assert len(again.list()) == 2


def test_a_bucket_another_handle_creates_is_found_within_a_second(tmp_path):
    """A search remembers a missing bucket for a second instead of asking Chroma each time;
    this handle's own writes are seen at once, another handle's within the second."""
    with MemoryStore.open(tmp_path / "m") as reader, MemoryStore.open(tmp_path / "m") as writer:
        assert reader.search("橘猫团子", persona_id="xilian") == []
        reader.add(MemoryItem(content="主人养了一只叫团子的橘猫", scope=Scope.USER))
        assert len(reader.search("橘猫团子", persona_id="xilian")) == 1
        writer.add(MemoryItem(content="星野的橘猫叫团子", scope=Scope.PERSONA, persona_id="xilian"))
        deadline = time.monotonic() + 3.0
        while len(reader.search("橘猫团子", persona_id="xilian")) < 2:
            assert time.monotonic() < deadline, "another handle's new bucket never showed"
            time.sleep(0.05)


def test_the_plug_in_protocols(tmp_path):
    with MemoryStore.open(tmp_path / "m") as store:
        assert isinstance(store, MemoryBackend) and isinstance(store, FindsNeighbours)
        assert isinstance(ManualExtractor(), Extractor)
        assert isinstance(LLMExtractor(ScriptedChatModel(script=[])), Extractor)
    assert not isinstance(object(), MemoryBackend) and not isinstance(object(), Extractor)

    class Plain:
        """A user's extractor: no base class, just the two members."""

        background = True

        def extract(self, messages):
            return []

    assert isinstance(Plain(), Extractor)
