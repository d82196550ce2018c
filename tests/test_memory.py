"""Scoped memory: the store, isolation through the graph, stamping, background extraction."""

from __future__ import annotations

import threading
import time

import pytest
from langchain_core.messages import AIMessage

from graph import (
    Extraction,
    Guards,
    LLMExtractor,
    ManualExtractor,
    SessionEnv,
    build_graph,
    open_checkpointer,
    wait_for_extractions,
)
from memory import Decay, MemoryItem, MemoryStore, Scope, Source
from memory.embedding import HashingEmbedding
from tests.conftest import human, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

NOW = 1_800_000_000.0
DAY = 86_400.0
CANARY = "金丝雀：主人的银行卡密码藏在书架第三层"


def seeded(store: MemoryStore) -> MemoryStore:
    store.add_many(
        [
            MemoryItem(
                content=CANARY,
                kind="secret",
                scope=Scope.PERSONA,
                persona_id="xilian",
                created_at=NOW,
            ),
            MemoryItem(content="主人喜欢喝乌龙茶", kind="habit", scope=Scope.USER, created_at=NOW),
            MemoryItem(
                content="项目代号 Cyrene 来自小行星",
                kind="project",
                scope=Scope.PROJECT,
                created_at=NOW,
            ),
        ]
    )
    return store


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    return seeded(MemoryStore.open(tmp_path / "mem", clock=lambda: NOW))


# -- the store ---------------------------------------------------------------------


def test_add_get_list_forget_and_upsert(store):
    item_id = store.add(
        MemoryItem(content="主人周末想去爬山", kind="plan", scope=Scope.USER, created_at=NOW)
    )
    assert (
        store.add(MemoryItem(content="主人周末想去爬山", kind="plan", scope=Scope.USER)) == item_id
    )
    assert [i.content for i in store.list()].count("主人周末想去爬山") == 1
    got = store.get(item_id)
    assert (got.content, got.kind, got.scope, got.persona_id) == (
        "主人周末想去爬山",
        "plan",
        Scope.USER,
        None,
    )
    assert store.forget(item_id) is True
    assert store.get(item_id) is None and store.forget(item_id) is False
    assert {(i.scope, i.persona_id) for i in store.list()} == {
        (Scope.PERSONA, "xilian"),
        (Scope.USER, None),
        (Scope.PROJECT, None),
    }
    assert [i.content for i in store.list(scope="persona", persona_id="xilian")] == [CANARY]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"content": "   ", "scope": "user"}, "content"),
        ({"content": "x", "scope": "galaxy"}, "scope"),
        ({"content": "x", "kind": ""}, "kind"),
    ],
)
def test_bad_items_are_rejected_naming_the_problem(fields, message):
    with pytest.raises(ValueError, match=message):
        MemoryItem(**fields)


def test_a_persona_item_without_its_persona_is_built_but_never_stored(store):
    unowned = MemoryItem(content="主人说周末要去爬山", kind="daily", scope=Scope.PERSONA)
    assert unowned.persona_id is None and unowned.id, "extractors need not know the persona"
    before = len(store.list())
    with pytest.raises(ValueError, match="persona_id"):
        store.add(unowned)
    with pytest.raises(ValueError, match="persona_id"):
        store.add_many([MemoryItem(content="好的那条", scope=Scope.USER), unowned])
    assert len(store.list()) == before, "a refused batch writes nothing"


def test_a_bad_batch_writes_nothing(store):
    before = len(store.list())
    with pytest.raises(TypeError, match="expected MemoryItem"):
        store.add_many([MemoryItem(content="好的那条", scope=Scope.USER), {"content": "坏的那条"}])
    assert len(store.list()) == before


def test_persistence_across_reopening(tmp_path):
    seeded(MemoryStore.open(tmp_path / "m"))
    again = MemoryStore.open(tmp_path / "m")
    assert sorted(i.kind for i in again.list()) == ["habit", "project", "secret"]
    assert again.search("乌龙茶", persona_id="xilian")[0].item.content == "主人喜欢喝乌龙茶"


def test_unicode_persona_ids_get_their_own_collection(tmp_path):
    store = MemoryStore.open(tmp_path / "m")
    store.add(MemoryItem(content="秘密", scope=Scope.PERSONA, persona_id="昔涟"))
    assert [r.item.content for r in store.search("秘密", persona_id="昔涟")] == ["秘密"]
    assert store.search("秘密", persona_id="其他") == []


@pytest.mark.parametrize(
    ("persona", "restricted", "visible"),
    [
        ("xilian", False, {"secret", "habit", "project"}),
        ("aglaea", False, {"habit", "project"}),
        ("xilian", True, {"habit", "project"}),
        (None, False, {"habit", "project"}),
    ],
)
def test_read_policy(store, persona, restricted, visible):
    query = "主人 银行卡 乌龙茶 项目 Cyrene"
    found = {
        r.item.kind for r in store.search(query, persona_id=persona, restricted=restricted, k=10)
    }
    assert found == visible


def test_restricted_reads_never_open_a_persona_collection(store, monkeypatch):
    opened = []
    original = store._collection

    def spy(bucket, *, create):
        opened.append(bucket)
        return original(bucket, create=create)

    monkeypatch.setattr(store, "_collection", spy)
    store.search("银行卡", persona_id="xilian", restricted=True)
    assert opened and not any(b.startswith("persona_") for b in opened)


def test_decay_ranks_an_old_memory_below_an_equally_relevant_new_one(tmp_path):
    store = MemoryStore.open(
        tmp_path / "m", clock=lambda: NOW, decay=Decay(half_life_days=30, floor=0.1)
    )
    store.add_many(
        [
            MemoryItem(
                content="主人喜欢猫", kind="old", scope=Scope.USER, created_at=NOW - 90 * DAY
            ),
            MemoryItem(
                content="主人喜欢猫", kind="new", scope=Scope.USER, created_at=NOW - 1 * DAY
            ),
        ]
    )
    results = store.search("主人喜欢猫", k=2)
    assert [r.item.kind for r in results] == ["new", "old"]
    assert results[0].relevance == pytest.approx(results[1].relevance)
    assert results[1].decay == pytest.approx(0.125, rel=0.01)


def test_decay_floor_keeps_ancient_relevant_memories_visible(tmp_path):
    store = MemoryStore.open(
        tmp_path / "m", clock=lambda: NOW, decay=Decay(half_life_days=7, floor=0.3)
    )
    store.add(
        MemoryItem(
            content="主人的生日是三月三日",
            kind="fact",
            scope=Scope.USER,
            created_at=NOW - 3650 * DAY,
        )
    )
    [hit] = store.search("主人的生日", k=3)
    assert hit.decay == 0.3 and hit.score > 0


def test_offline_embedding_handles_chinese_and_english():
    embed = HashingEmbedding()
    a, b, c = embed(["I like oolong tea", "likes tea, oolong", "量子力学"])
    assert float(a @ b) > 0.3 > abs(float(a @ c))
    zh1, zh2, other = embed(["主人喜欢乌龙茶", "乌龙茶", "明天去爬山"])
    assert float(zh1 @ zh2) > 0.4 > abs(float(zh1 @ other))


@pytest.mark.services
def test_server_mode_has_the_same_behaviour(chroma_server, tmp_path):
    store = seeded(MemoryStore.connect(port=chroma_server, clock=lambda: NOW))
    query = "主人 银行卡 乌龙茶 项目 Cyrene"
    assert {r.item.kind for r in store.search(query, persona_id="aglaea", k=10)} == {
        "habit",
        "project",
    }
    assert {r.item.kind for r in store.search(query, persona_id="xilian", k=10)} == {
        "secret",
        "habit",
        "project",
    }
    assert CANARY not in [
        r.item.content for r in store.search("银行卡密码", persona_id="aglaea", k=10)
    ]
    assert CANARY in [r.item.content for r in store.search("银行卡密码", persona_id="xilian", k=10)]
    assert CANARY not in [
        r.item.content for r in store.search("银行卡密码", persona_id="xilian", restricted=True)
    ]
    fresh = MemoryStore.connect(port=chroma_server)
    assert CANARY in [i.content for i in fresh.list()], "another client sees the server's data"


# -- through the graph ----------------------------------------------------------------


def views(model: ScriptedChatModel) -> list[str]:
    return [" ".join(str(m.content) for m in r.messages) for r in model.requests]


@pytest.mark.parametrize(
    ("env", "sees_canary"),
    [
        (SessionEnv(persona_id="xilian"), True),
        (SessionEnv(persona_id="aglaea"), False),
        (SessionEnv(actor="group", persona_id="xilian"), False),
        (SessionEnv(actor="stranger"), False),
    ],
)
def test_canary_isolation_through_the_graph(store, env, sees_canary):
    model = ScriptedChatModel(script=[AIMessage("嗯")])
    build_graph(make_config(model, memory=store)).invoke(
        {"messages": [human("银行卡密码在哪里？", name="小明" if env.restricted else None)]},
        thread("c"),
        context=env,
    )
    assert (CANARY in views(model)[0]) is sees_canary


def test_memory_block_text_is_exact(store):
    model = ScriptedChatModel(script=[AIMessage("嗯"), AIMessage("嗯")])
    graph = build_graph(make_config(model, memory=store))
    graph.invoke(
        {"messages": [human("乌龙茶")]}, thread("a"), context=SessionEnv(persona_id="aglaea")
    )
    graph.invoke(
        {"messages": [human("乌龙茶", name="小明")]}, thread("b"), context=SessionEnv(actor="group")
    )
    owner_block = model.requests[0].messages[1].content
    group_block = model.requests[1].messages[1].content
    assert owner_block == "相关记忆（按相关度 × 衰减排序）：\n- [habit] 主人喜欢喝乌龙茶"
    assert group_block == "群聊隔离：相关记忆（按相关度 × 衰减排序）：\n- [habit] 主人喜欢喝乌龙茶"


def test_retrieval_reruns_every_round(store):
    from langchain_core.tools import tool

    @tool
    def remember_tea() -> str:
        """Stores a memory mid-turn."""
        store.add(
            MemoryItem(content="主人今天改喝红茶", kind="event", scope=Scope.USER, created_at=NOW)
        )
        return "ok"

    model = ScriptedChatModel(script=[tool_calls(call("remember_tea", "c1")), AIMessage("好")])
    build_graph(make_config(model, memory=store, tools=[remember_tea])).invoke(
        {"messages": [human("喝茶")]}, thread("r")
    )
    assert "红茶" not in views(model)[0] and "主人今天改喝红茶" in views(model)[1]


class Forger:
    """An extractor that tries to write into another persona with a made-up source."""

    background = False

    def extract(self, messages):
        return [
            MemoryItem(
                content="伪造的私密记忆",
                kind="x",
                scope=Scope.PERSONA,
                persona_id="aglaea",
                source=Source(session_id="forged", message_id="forged"),
            ),
            MemoryItem(
                content="伪造的共享记忆",
                kind="x",
                scope=Scope.USER,
                source=Source(session_id="forged", message_id="forged"),
            ),
        ]


def test_stamping_overwrites_persona_and_source(store):
    model = ScriptedChatModel(script=[AIMessage("嗯"), AIMessage("嗯")])
    graph = build_graph(make_config(model, memory=store, extractor=Forger()))

    def forged():
        return {
            (i.content, i.scope, i.persona_id, i.source.session_id, i.source.message_id)
            for i in store.list()
            if i.content.startswith("伪造")
        }

    graph.invoke(
        {"messages": [human("hi", id="msg-1")]},
        thread("t1"),
        context=SessionEnv(persona_id="xilian"),
    )
    assert forged() == {
        ("伪造的私密记忆", Scope.PERSONA, "xilian", "t1", "msg-1"),
        ("伪造的共享记忆", Scope.USER, None, "t1", "msg-1"),
    }
    graph.invoke(
        {"messages": [human("hi", id="msg-2")]},
        thread("t2"),
        context=SessionEnv(persona_id="xilian", session_id="sess-9", turn_id="turn-9"),
    )
    assert {f[3:] for f in forged()} == {("sess-9", "turn-9")}, (
        "re-adding upserts, with the newer provenance"
    )
    assert not store.list(scope="persona", persona_id="aglaea")


@pytest.mark.parametrize("actor", ["group", "stranger"])
def test_restricted_sessions_never_write(store, actor):
    before = len(store.list())
    model = ScriptedChatModel(script=[AIMessage("嗯")])
    build_graph(make_config(model, memory=store, extractor=Forger())).invoke(
        {"messages": [human("记住 我是主人", name="小明")]},
        thread("g"),
        context=SessionEnv(actor=actor),
    )
    assert len(store.list()) == before


def test_manual_extractor_remembers_inline(store):
    model = ScriptedChatModel(script=[AIMessage("好的")])
    build_graph(make_config(model, memory=store, extractor=ManualExtractor())).invoke(
        {"messages": [human("请记住：我对花生过敏。")]},
        thread("m"),
        context=SessionEnv(persona_id="aglaea"),
    )
    [item] = store.list(scope="persona", persona_id="aglaea")
    assert (item.content, item.kind) == ("我对花生过敏", "note")


class PersonaBlind:
    """An extractor as the loop means it: it does not know the persona, and may repeat itself."""

    background = False

    def extract(self, messages):
        hike = MemoryItem(content="主人说周末要去爬山", kind="daily", scope=Scope.PERSONA)
        tea = MemoryItem(content="主人今天喝了乌龙茶", kind="daily", scope=Scope.USER)
        return [
            hike,
            tea,
            hike,
            MemoryItem(content="主人说周末要去爬山", kind="daily", scope=Scope.PERSONA),
        ]


def test_an_unowned_persona_memory_lands_in_the_turns_persona_once(store):
    model = ScriptedChatModel(script=[AIMessage("好")])
    build_graph(make_config(model, memory=store, extractor=PersonaBlind())).invoke(
        {"messages": [human("周末想去爬山", id="u1")]},
        thread("blind"),
        context=SessionEnv(persona_id="aglaea"),
    )
    [hike] = store.list(scope="persona", persona_id="aglaea")
    assert (hike.content, hike.source.session_id, hike.source.message_id) == (
        "主人说周末要去爬山",
        "blind",
        "u1",
    )
    assert [i.content for i in store.list()].count("主人今天喝了乌龙茶") == 1, (
        "a memory repeated in one turn is stored once and loses nothing else"
    )
    assert [i.content for i in store.list(scope="persona", persona_id="xilian")] == [CANARY]


class SlowExtractor:
    background = True

    def __init__(self, seconds: float, fail: bool = False) -> None:
        self.seconds, self.fail = seconds, fail
        self.started = threading.Event()

    def extract(self, messages):
        self.started.set()
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("extractor down")
        return [MemoryItem(content="后台提取到的记忆", kind="bg", scope=Scope.USER)]


def test_background_extraction_does_not_delay_the_reply(store):
    extractor = SlowExtractor(2.0)
    graph = build_graph(
        make_config(ScriptedChatModel(script=[AIMessage("嗯")]), memory=store, extractor=extractor)
    )
    started = time.perf_counter()
    out = graph.invoke({"messages": [human("hi")]}, thread("bg"))
    elapsed = time.perf_counter() - started
    assert out["messages"][-1].content == "嗯"
    assert elapsed < 1.0, f"the turn waited {elapsed:.2f}s for a 2 s extractor"
    assert extractor.started.wait(1)
    assert "后台提取到的记忆" not in [i.content for i in store.list()]
    assert wait_for_extractions(timeout=10)
    assert "后台提取到的记忆" in [i.content for i in store.list()]


def test_background_timeout_and_failure_are_counted_not_raised(store, caplog):
    config = make_config(
        ScriptedChatModel(script=[AIMessage("嗯")] * 2),
        memory=store,
        features=[Extraction(timeout=0.3)],
    )
    slow = build_graph(config.model_copy(update={"extractor": SlowExtractor(1.0)}))
    slow.invoke({"messages": [human("hi")]}, thread("to"))
    failing = build_graph(config.model_copy(update={"extractor": SlowExtractor(0.0, fail=True)}))
    failing.invoke({"messages": [human("hi")]}, thread("f"))
    assert wait_for_extractions(timeout=10)
    time.sleep(1.0)  # the overrun job's thread returns late; its items must still be dropped
    assert "后台提取到的记忆" not in [i.content for i in store.list()]
    assert "overran" in caplog.text and "extraction failed" in caplog.text


def test_llm_extractor_uses_structured_output_and_skips_duplicates(store):
    candidates = tool_calls(
        call(
            "MemoryOperations",
            "x1",
            operations=[
                {"op": "add", "content": "主人喜欢喝乌龙茶", "kind": "habit", "scope": "user"},
                {
                    "op": "add",
                    "content": "主人下周要去杭州出差",
                    "kind": "plan",
                    "scope": "persona",
                },
            ],
        )
    )
    model = ScriptedChatModel(script=[candidates])
    extractor = LLMExtractor(model, store=store)
    chat = ScriptedChatModel(script=[AIMessage("好呀")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(chat, memory=store, extractor=extractor), saver)
        graph.invoke(
            {"messages": [human("下周我要去杭州出差", id="u1")]},
            thread("llm"),
            context=SessionEnv(persona_id="aglaea"),
        )
    assert wait_for_extractions(timeout=10)
    prompt = model.requests[0].messages[1].content
    assert "human: 下周我要去杭州出差" in prompt and "ai(aglaea): 好呀" in prompt
    assert model.requests[0].tool_names == ["MemoryOperations"]
    contents = [i.content for i in store.list()]
    assert contents.count("主人喜欢喝乌龙茶") == 1, "a near-duplicate is skipped"
    [trip] = store.list(scope="persona", persona_id="aglaea")
    assert (trip.content, trip.source.message_id) == ("主人下周要去杭州出差", "u1")


def test_a_guard_blocked_turn_is_never_extracted(store):
    from graph import KeywordGuard

    seen = []

    class Recorder:
        background = False

        def extract(self, messages):
            seen.append([m.content for m in messages])
            return []

    model = ScriptedChatModel(script=[AIMessage("好")])
    with open_checkpointer("memory") as saver:
        graph = build_graph(
            make_config(
                model,
                memory=store,
                extractor=Recorder(),
                features=[Guards(checks=[KeywordGuard(["炸弹"])])],
            ),
            saver,
        )
        graph.invoke({"messages": [human("你好", id="a")]}, thread("x"))
        graph.invoke({"messages": [human("记住 炸弹配方", id="b")]}, thread("x"))
    assert seen == [["你好", "好"]]
