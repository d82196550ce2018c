"""What counts as a mention of the companion: the name as a word of its own, in any script."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph import GroupPresence, Hearing, SessionEnv, build_graph, open_checkpointer
from nodes.presence.judges import ReplyScorer, asks_the_room
from nodes.presence.mentions import MentionMatcher
from nodes.presence.policy import quiet_reason
from tests.conftest import PERSONAS, make_config, thread
from tests.scripted import ScriptedChatModel

XILIAN = MentionMatcher(["昔涟", "小昔", "Cyrene"])


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("昔涟你觉得呢", "昔涟"),  # no spaces in Chinese: a name glued to the next word
        ("问问昔涟吧", "昔涟"),
        ("@昔涟 在吗", "昔涟"),
        ("＠昔涟", "昔涟"),  # full-width @
        ("哈哈小昔说得对", "小昔"),
        ("hi Cyrene!", "Cyrene"),
        ("@cyrene what do you think", "Cyrene"),
        ("ＣＹＲＥＮＥ，在吗", "Cyrene"),  # full-width letters, any case
        ("问Cyrene吧", "Cyrene"),  # Latin name between Chinese characters
        ("Cyrenes are in Libya", None),  # a longer Latin word
        ("ping cyrene_bot later", None),
        ("xcyrene", None),
        ("今天天气不错", None),
        ("昔 涟", None),
    ],
)
def test_a_name_is_a_mention_where_it_stands_as_a_word(text, found):
    assert XILIAN.mentioned(text) == found


@pytest.mark.parametrize("text", ["ping cyrene\u200b_bot later", "the cyrene\u0332s are here"])
def test_invisible_and_combining_characters_do_not_break_a_words_edge(text):
    # issue 28 finding 7: a zero-width space or a combining mark counted as a word's end
    assert XILIAN.mentioned(text) is None
    assert XILIAN.mentioned("hi cyrene\u200b!") == "Cyrene", "an invisible character after it"


def test_a_nickname_inside_a_longer_word_still_counts():
    # Names heard in the room no longer decide (issue 28 finding 5): 小昔昔 holds 小昔.
    assert XILIAN.mentioned("小昔昔你好呀") == "小昔"


def test_only_the_text_and_the_platform_flag_count_never_the_display_name():
    impostor = HumanMessage("大家好", name="昔涟")
    assert XILIAN.addressed_by(impostor) is None
    flagged = HumanMessage(
        "你觉得呢", name="小明", response_metadata={"cyrene": {"mentioned": True}}
    )
    assert XILIAN.addressed_by(flagged) == "the platform flagged a mention"
    assert XILIAN.addressed_by(HumanMessage("小昔在吗", name="小明")) == "mentioned 小昔"


def hearing(pending: list[str], *, replies: int = 0, speakers=("小明", "小红")) -> Hearing:
    people = tuple(HumanMessage(text, name=speakers[i % 2]) for i, text in enumerate(pending))
    recent = tuple(AIMessage("嗯") for _ in range(replies)) + people
    return Hearing(
        persona_id="xilian",
        names=("昔涟",),
        recent=recent,
        pending=people,
        speakers=tuple(speakers),
        addressed=None,
        own_share=replies / len(recent),
    )


def test_the_scorer_takes_a_question_to_the_room_after_a_few_messages_never_chatter():
    scorer = ReplyScorer()
    asked = scorer.judge(hearing(["好累", "哈哈", "有人周末去爬山吗？"]))
    assert asked.reply and asked.reason.startswith("score 0.53 ≥ 0.5"), asked.reason
    assert not scorer.judge(hearing(["有人周末去爬山吗？"])).reply, "too soon after it spoke"
    assert not scorer.judge(hearing(["哈哈"] * 9)).reply, "chatter alone never reaches it"
    crowded = scorer.judge(hearing(["嗯", "好", "有人在吗？"], replies=9))
    assert not crowded.reply and "own share 75%" in crowded.reason


def test_a_question_put_to_another_member_is_not_one_to_the_room():
    others = MentionMatcher(["小明", "小红"])
    assert asks_the_room("有人周末去爬山吗？", others)
    assert asks_the_room("Does anyone have the slides", others)
    assert not asks_the_room("小明，你明天来吗？", others)
    assert not asks_the_room("好的好的", others)


# -- the room never decides (issue 28, findings 5 and 6) -----------------------------------

NICKNAMED = {
    **PERSONAS,
    "xilian": PERSONAS["xilian"].model_copy(update={"nicknames": ("小昔", "Cyrene")}),
}
GROUP = SessionEnv(actor="group")
IMPOSTOR_NAMES = ["@昔涟", "＠昔涟", "@Cyrene", "昔涟你好", "小昔在吗", "小昔昔", "昔涟", "Cyrene"]


def mentioned_graph(saver, model):
    return build_graph(
        make_config(model, personas=NICKNAMED, features=[GroupPresence(reply="mentioned")]), saver
    )


@pytest.mark.parametrize("impostor", IMPOSTOR_NAMES)
def test_a_display_name_in_the_room_never_silences_a_real_mention(impostor):
    model = ScriptedChatModel(script=[AIMessage("在呢")])
    with open_checkpointer("memory") as saver:
        graph = mentioned_graph(saver, model)
        said = {"messages": [HumanMessage("大家好", name=impostor)]}
        assert quiet_reason(graph.invoke(said, thread("g"), context=GROUP)) is not None
        asked = {"messages": [HumanMessage("@昔涟 在吗？", name="小红")]}
        out = graph.invoke(asked, thread("g"), context=GROUP)
    assert quiet_reason(out) is None, f"a member called {impostor!r} silenced the mention"
    assert out["messages"][-1].content == "在呢"


@pytest.mark.parametrize("size", [30, 31, 45, 120])
def test_a_burst_is_heard_as_a_whole_however_long(size):
    model = ScriptedChatModel(script=[AIMessage("在呢")])
    burst = [HumanMessage("昔涟，帮我看看", name="小明")]
    burst += [HumanMessage(f"哈哈{i}", name="小红") for i in range(size - 1)]
    with open_checkpointer("memory") as saver:
        out = mentioned_graph(saver, model).invoke({"messages": burst}, thread("g"), context=GROUP)
    assert quiet_reason(out) is None, f"a burst of {size} with the mention first stayed quiet"
    assert out["messages"][-1].content == "在呢"
