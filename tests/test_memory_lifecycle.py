"""Facts that change: supersede, forget, near-duplicates, and the operations' guards.

Turns run through the real graph on a real embedded store; model-driven
extraction uses the scripted chat model with `LLMExtractor`'s structured output.
"""

from __future__ import annotations

import logging

import pytest
from langchain_core.messages import AIMessage

from graph import LLMExtractor, ManualExtractor, build_graph, wait_for_extractions
from memory import MemoryItem, MemoryStore, Scope
from memory.lifecycle.duplicates import DUPLICATE_COSINE, drop_duplicates
from memory.lifecycle.operations import Change
from memory.retrieval.ranking import SearchResult
from tests.cli_support import cyrene
from tests.conftest import human, make_config, owner, thread
from tests.scripted import ScriptedChatModel, call, tool_calls


@pytest.fixture
def store(tmp_path) -> MemoryStore:
    with MemoryStore.open(tmp_path / "memory") as opened:
        yield opened


def chat(store: MemoryStore, extractor, *texts: str, persona: str = "xilian") -> None:
    """One owner turn per text, on one session."""
    model = ScriptedChatModel(script=[AIMessage("好的")] * len(texts))
    graph = build_graph(make_config(model, memory=store, extractor=extractor))
    for n, text in enumerate(texts):
        graph.invoke(
            {"messages": [human(text, id=f"t{n}")]}, thread("life"), context=owner(persona)
        )
    assert wait_for_extractions(10)


def block(store: MemoryStore, query: str) -> list[str]:
    """What the memory block of a turn asking `query` would show."""
    return [hit.item.content for hit in store.search(query, persona_id="xilian")]


def disk_bytes(folder) -> bytes:
    """Every byte of every file under the store's folder (SQLite, its journals, indexes)."""
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_a_correction_supersedes_the_old_fact_and_keeps_its_history(store, tmp_path, capsys):
    manual = ManualExtractor(scope=Scope.USER)
    # The correction names what it corrects (where I live): issue 29 finding 2. "更正：我搬到
    # 上海了" shares no word with it and is added as a fact of its own instead.
    chat(store, manual, "记住 我住在北京", "更正：我住在上海了")
    assert [i.content for i in store.list()] == ["我住在上海了"]
    assert "我住在北京" not in block(store, "我住在哪里？"), "never injected again"
    [new] = store.list()
    old, now = store.history(new.id)
    assert (old.state, old.item.content, old.superseded_by) == ("superseded", "我住在北京", new.id)
    assert now.state == "live" and old.at is not None
    assert [e.item_id for e in store.history(old.item_id)] == [old.item_id, new.id]
    store.close()
    shown = cyrene(capsys, "memory", "history", new.id, "--data", str(tmp_path))
    assert shown.code == 0, shown.err
    assert "superseded" in shown.out and "我住在北京" in shown.out and "我住在上海了" in shown.out


def test_forget_in_an_owner_chat_erases_the_text_from_search_export_and_disk(
    store, tmp_path, caplog
):
    caplog.set_level(logging.INFO, "cyrene.memory")
    manual = ManualExtractor(scope=Scope.USER)
    chat(store, manual, "记住 我的银行卡密码是七七八八", "更正：我的银行卡密码改成了九九六六")
    [card] = store.list()
    chat(store, manual, "忘掉银行卡密码")
    assert store.list() == [] and block(store, "银行卡密码") == []
    assert [e.state for e in store.history(card.id)] == ["forgotten"]
    audit = [r.getMessage() for r in caplog.records if "forgotten" in r.getMessage()]
    assert any(card.id in line and "scope=user" in line for line in audit)
    assert not any("九九六六" in line or "七七八八" in line for line in caplog.messages)
    on_disk = disk_bytes(tmp_path / "memory")
    for text in ("九九六六", "七七八八", "银行卡密码"):
        assert text.encode() not in on_disk, f"{text} is still in the store's files"


def test_dont_forget_is_not_a_forget(store):
    chat(store, ManualExtractor(scope=Scope.USER), "记住 周五交报告", "别忘掉周五交报告")
    chat(store, ManualExtractor(scope=Scope.USER), "Don't forget that the report is due")
    assert [i.content for i in store.list()] == ["周五交报告"]


def test_a_reworded_fact_is_stored_once_and_a_different_number_is_not_a_duplicate(store):
    manual = ManualExtractor(scope=Scope.USER)
    chat(store, manual, "记住 主人养了一只叫团子的橘猫", "记住 主人的橘猫名叫团子")
    chat(store, manual, "记住 主人每天早上跑步5公里", "记住 主人每天早上跑步3公里")
    assert sorted(i.content for i in store.list()) == sorted(
        ["主人养了一只叫团子的橘猫", "主人每天早上跑步5公里", "主人每天早上跑步3公里"]
    )


def test_a_shown_memory_behind_a_crowd_of_close_ones_is_still_compared(store):
    """The check reads the new fact's nearest memories with the store's own cosines; a
    memory shown to the extractor beyond them is compared too when the nearest are all
    that close (here twelve runs of other lengths: close, but other numbers)."""
    crowd = [f"主人每天早上跑步{n}公里" for n in range(6, 18)]
    store.add_many(MemoryItem(content=text, scope=Scope.USER) for text in crowd)
    shown = MemoryItem(content="主人每天清晨跑5公里", scope=Scope.USER)
    store.add(shown)
    new = MemoryItem(content="主人每天早上跑步5公里", scope=Scope.USER)
    nearest = store.nearest(new.content, k=10)
    assert shown.id not in {item.id for item, _ in nearest}
    assert min(cosine for _, cosine in nearest) >= DUPLICATE_COSINE
    assert store.similarities(new.content, [shown.content])[0] >= DUPLICATE_COSINE
    add = Change(action="add", item=new, at=0.0)
    assert drop_duplicates([add], store, "xilian", recalled=[shown]) == []
    assert drop_duplicates([add], store, "xilian", recalled=[]) == [add]

    class Plain:
        """A user's backend: search and add_many only, so nothing to compare with."""

        def search(self, query, persona_id=None, restricted=False, k=8):
            return store.search(query, persona_id, restricted, k)

        def add_many(self, items):
            return store.add_many(items)

    assert drop_duplicates([add], Plain(), "xilian", recalled=[shown]) == [add]


def operations(*ops: dict) -> AIMessage:
    return tool_calls(call("MemoryOperations", "op1", operations=list(ops)))


def test_llm_operations_refuse_a_handle_out_of_range_and_go_on(store, caplog):
    store.add(MemoryItem(content="主人喜欢喝乌龙茶", kind="habit", scope=Scope.USER))
    model = ScriptedChatModel(
        script=[
            operations(
                {"op": "forget", "handle": 7},
                {"op": "supersede", "handle": 1, "content": "主人改喝红茶了", "kind": "habit"},
                {"op": "add", "content": "主人下周去杭州出差", "kind": "plan", "scope": "persona"},
            )
        ]
    )
    chat(store, LLMExtractor(model), "我最近改喝红茶了，下周还要去杭州出差")
    request = model.requests[0]
    assert request.tool_names == ["MemoryOperations"]
    assert "1. [habit] 主人喜欢喝乌龙茶" in request.messages[1].content, "shown with a handle"
    assert sorted(i.content for i in store.list()) == ["主人下周去杭州出差", "主人改喝红茶了"]
    [trip] = store.list(scope="persona", persona_id="xilian")
    assert trip.source.message_id == "t0", "the loop stamps persona and provenance"
    assert "handle 7 is not one of the" in caplog.text


class LeakyStore(MemoryStore):
    """A backend whose ranking for the extractor (`relevant`) also returns another persona's
    private memory (a bug the loop must not turn into a write)."""

    def relevant(self, query, persona_id=None, k=8):
        foreign = self.get(FOREIGN.id)
        found = list(super().relevant(query, persona_id, k))
        return [SearchResult(foreign, 1.0, 1.0, 1.0), *found] if foreign else found


FOREIGN = MemoryItem(
    content="阿格莱雅和主人的约定", kind="secret", scope=Scope.PERSONA, persona_id="aglaea"
)


def test_an_operation_on_another_personas_memory_is_refused_and_logged(tmp_path, caplog):
    with LeakyStore.open(tmp_path / "leaky") as leaky:
        leaky.add(FOREIGN)
        model = ScriptedChatModel(
            script=[
                operations({"op": "forget", "handle": 1}, {"op": "add", "content": "主人爱吃面"})
            ]
        )
        chat(leaky, LLMExtractor(model), "忘掉那个约定，另外我爱吃面")
        assert sorted(i.content for i in leaky.list()) == ["主人爱吃面", "阿格莱雅和主人的约定"]
    assert "not writable by persona 'xilian'" in caplog.text


def test_restricted_sessions_never_supersede_or_forget(store):
    from graph import SessionEnv

    store.add(MemoryItem(content="主人喜欢喝乌龙茶", scope=Scope.USER))
    model = ScriptedChatModel(script=[AIMessage("好")])
    graph = build_graph(
        make_config(model, memory=store, extractor=ManualExtractor(scope=Scope.USER))
    )
    graph.invoke(
        {"messages": [human("忘掉乌龙茶", id="g1", name="小明")]},
        thread("group"),
        context=SessionEnv(actor="group"),
    )
    assert wait_for_extractions(10)
    assert [i.content for i in store.list()] == ["主人喜欢喝乌龙茶"]


def test_an_llm_add_that_names_no_scope_stays_private_to_the_persona(store):
    """A model's operation that leaves `scope` out stores a memory no group or stranger chat
    reads: the owner's words are the owner's unless the model says they may be shared."""
    store.add(MemoryItem(content="主人喜欢喝乌龙茶", kind="habit", scope=Scope.USER))
    model = ScriptedChatModel(script=[operations({"op": "add", "content": "主人住在翠柳街88号"})])
    chat(store, LLMExtractor(model), "我家住在翠柳街88号，别告诉别人")
    [address] = [i for i in store.list() if "翠柳街" in i.content]
    assert (address.scope, address.persona_id) == (Scope.PERSONA, "xilian")
    assert not [
        h for h in store.search("翠柳街88号", restricted=True) if "翠柳街" in h.item.content
    ]


def test_a_forgotten_memory_does_not_come_back_when_an_older_checkpoint_is_replayed(store):
    """A fork of a turn that was extracted (Studio's "replay", `invoke` at a checkpoint id)
    runs it again with a new reply: its extraction already ran, so what the owner has
    forgotten since stays forgotten."""
    from graph import open_checkpointer

    model = ScriptedChatModel(script=[AIMessage("好的")] * 20)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, memory=store, extractor=ManualExtractor()), saver)
        graph.invoke(
            {"messages": [human("记住 我的暗号是RESURRECTzz71", id="m1")]},
            thread("fork"),
            context=owner("xilian"),
        )
        assert wait_for_extractions(10)
        [memory] = store.list()
        forks = [h.config for h in graph.get_state_history(thread("fork")) if h.next]
        store.forget(memory.id)
        for fork in forks:
            graph.invoke(None, fork, context=owner("xilian"))
            graph.invoke({"messages": [human("你好")]}, fork, context=owner("xilian"))
            assert wait_for_extractions(10)
            assert not store.list(), (
                f"back after a replay at {fork['configurable']['checkpoint_id']}"
            )


def test_a_turn_edited_in_studio_and_replayed_goes_on_and_brings_back_nothing(store):
    """Studio's edit (`update_state` at a checkpoint, then a replay) puts in words said outside
    any turn: the replayed turn goes on, extracts nothing from them, and nothing again from
    the turns before it (the forgotten memory stays forgotten)."""
    from graph import open_checkpointer

    model = ScriptedChatModel(script=[AIMessage("好的")] * 20)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, memory=store, extractor=ManualExtractor()), saver)
        for text, id in (("记住 我的暗号是RESURRECTzz71", "m1"), ("今天天气不错", "m2")):
            graph.invoke(
                {"messages": [human(text, id=id)]}, thread("edit"), context=owner("xilian")
            )
        assert wait_for_extractions(10)
        [memory] = store.list()
        store.forget(memory.id)
        for state in graph.get_state_history(thread("edit")):
            if state.next != ("call_model",):
                continue
            edit = human("记住 我的暗号是EDITEDzz72", id=state.values["messages"][-1].id)
            edited = graph.update_state(state.config, {"messages": [edit]})
            graph.invoke(None, edited, context=owner("xilian"))
            assert wait_for_extractions(10)
            assert not store.list(), f"after an edit of {edit.id}"
