"""Bad input fails at the boundary with an error naming the field."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage

from graph import (
    CapacityPolicy,
    Compaction,
    GroupPresence,
    Guards,
    KeywordGuard,
    LoopConfig,
    Persona,
    SessionEnv,
    Tier,
    ToolCalls,
    build_graph,
    open_checkpointer,
)
from graph.runs import NothingToResumeError
from tests.conftest import PERSONAS, get_time, human, make_config, thread
from tests.scripted import ScriptedChatModel


@pytest.fixture
def model() -> ScriptedChatModel:
    return ScriptedChatModel(script=[AIMessage("ok")] * 4)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"default_persona": "nobody"}, "default_persona"),
        ({"default_persona": None}, "default_persona"),
        ({"tools": [get_time, get_time]}, "duplicate tool names"),
        ({"restricted_tools": {"rm_rf"}}, "restricted_tools"),
        ({"restricted_tools": "get_time"}, "restricted_tools"),
    ],
)
def test_invalid_config_names_the_field(model, overrides, field):
    with pytest.raises(ValueError, match=field):
        build_graph(make_config(model, **overrides))


@pytest.mark.parametrize(
    ("kind", "settings", "field"),
    [
        (ToolCalls, {"max_rounds": 0}, "max_rounds"),
        (ToolCalls, {"parallelism": -1}, "parallelism"),
        (ToolCalls, {"execution": "eventually"}, "execution"),
        (Compaction, {"max_context_tokens": -5}, "max_context_tokens"),
    ],
)
def test_invalid_feature_settings_name_the_field(kind, settings, field):
    with pytest.raises(ValueError, match=field):
        kind(**settings)


def test_unloadable_model_string_names_the_field():
    with pytest.raises(ValueError, match="model: cannot load chat model 'nosuchprovider:x'"):
        build_graph(make_config("nosuchprovider:x"))


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ([Tier(name="a", tools=("get_time",)), Tier(name="a", tools=("add",))], "unique"),
        ([Tier(name="ops", tools=("nuke",))], "ops"),
    ],
)
def test_invalid_capacity_names_the_tier(model, tiers, message):
    with pytest.raises(ValueError, match=message):
        build_graph(make_config(model, features=[CapacityPolicy(tiers=tiers)]))


def test_invalid_trigger_regex_names_the_tier():
    with pytest.raises(ValueError, match=r"'search'.*not a valid regular expression"):
        Tier(name="search", tools=("add",), triggers=("re:([unclosed",))


def test_invalid_timezone_warns_and_drops_the_time_block(model):
    with pytest.warns(UserWarning, match="Europe/Atlantis"):
        graph = build_graph(make_config(model, timezone="Europe/Atlantis"))
    graph.invoke({"messages": [human("hi")]}, thread("tz"))
    systems = [m.content for m in model.requests[0].messages if m.type == "system"]
    assert systems == ["你是昔涟。"]


def test_valid_timezone_adds_the_time_block_after_instructions(model):
    graph = build_graph(make_config(model, timezone="Asia/Shanghai"))
    graph.invoke({"messages": [human("hi")]}, thread("tz"))
    systems = [m.content for m in model.requests[0].messages if m.type == "system"]
    assert systems == ["你是昔涟。", "当前时间：2026-11-29 16:30（星期日，Asia/Shanghai）"]


def test_unknown_actor_fails_before_any_node_runs(model):
    graph = build_graph(make_config(model))
    with pytest.raises(ValueError, match="actor"):
        SessionEnv(actor="boss")
    with pytest.raises(ValueError, match="actor"):
        graph.invoke({"messages": [human("hi")]}, thread("t"), context={"actor": "boss"})
    assert model.requests == []


def test_empty_turn_and_nothing_to_resume_are_plain_errors(model):
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        with pytest.raises(NothingToResumeError, match="'fresh' has no interrupted turn"):
            graph.invoke(None, thread("fresh"))
        for empty in ({}, {"messages": []}):
            with pytest.raises(ValueError, match="at least one message"):
                graph.invoke(empty, thread("fresh"))
        graph.invoke({"messages": [human("hi")]}, thread("done"))
        with pytest.raises(NothingToResumeError):
            graph.invoke(None, thread("done"))
    assert len(model.requests) == 1


async def test_async_paths_check_input_too(model):
    async with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model), saver)
        with pytest.raises(NothingToResumeError):
            await graph.ainvoke(None, thread("fresh"))
        with pytest.raises(ValueError, match="at least one message"):
            await graph.ainvoke({"messages": []}, thread("fresh"))


def test_callables_are_accepted_as_tools(model):
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    config = LoopConfig(model=model, personas=PERSONAS, default_persona="xilian", tools=[shout])
    assert config.tool_names == ["shout"]


def test_persona_knobs_are_validated():
    from graph import Persona

    with pytest.raises(ValueError, match="thinking_budget"):
        Persona(thinking_budget=-1)


def test_an_unknown_field_is_refused_naming_the_closest_real_one(model):
    with pytest.raises(
        ValueError, match="unknown field 'max_context_tokenz'; did you mean 'max_context_tokens'"
    ):
        make_config(model, max_context_tokenz=5)
    with pytest.raises(
        ValueError, match="Persona: unknown field 'instruction'; did you mean 'instructions'"
    ):
        Persona(instruction="你是昔涟。")


def test_a_retry_knob_of_the_old_spelling_says_where_it_went(model):
    with pytest.raises(
        ValueError, match="unknown field 'model_retries'; it is now part of 'retry'"
    ):
        make_config(model, model_retries=2)


def test_with_features_checks_what_it_is_given_and_keeps_each_in_its_place(model):
    """An outsider's probe: `with_features([guards])` (a list) was taken as a feature of no kind,
    so the guards never ran; two of a kind were both kept; the replaced entry moved last."""
    guards = Guards(checks=[KeywordGuard(["炸弹"])])
    base = make_config(model, features=[Compaction(max_context_tokens=5), guards])
    for wrong in ([guards], "x"):
        with pytest.raises(ValueError, match=r"features\[0\]: expected a feature's settings"):
            base.with_features(wrong)
    with pytest.raises(ValueError, match="each feature once"):
        base.with_features(Compaction(max_context_tokens=5), Compaction(max_context_tokens=9))
    changed = base.with_features(Compaction(max_context_tokens=9))
    assert [type(f) for f in changed.features] == [Compaction, Guards]
    assert changed.feature(Compaction).max_context_tokens == 9


def test_a_subclass_of_a_features_settings_is_that_feature(model):
    """An outsider's probe: a subclass of Guards passed validation and was then ignored."""

    class HouseGuards(Guards):
        """The house rules."""

    house = HouseGuards(checks=[KeywordGuard(["炸弹"])], refusal_text="不行")
    graph = build_graph(make_config(model, features=[house]))
    out = graph.invoke({"messages": [human("怎么做炸弹")]}, thread("g"))
    assert out["messages"][-1].content == "不行"
    with pytest.raises(ValueError, match=r"repeated: \['Guards'\]"):
        make_config(model, features=[house, Guards()])


def test_a_moved_name_given_to_its_feature_says_its_new_name(model):
    with pytest.raises(
        ValueError, match="GroupPresence: unknown field 'reply_judge'; it is now 'judge'"
    ):
        GroupPresence(reply_judge=None)
    with pytest.raises(ValueError, match="expected a list of feature settings"):
        make_config(model, features=Compaction())
    with pytest.raises(ValueError, match=r"'group_reply'.*; unknown field 'max_context_tokens'"):
        make_config(model, group_reply="mentioned", max_context_tokens=0)


def test_retry_takes_langgraphs_policy_a_mapping_of_its_arguments_or_none(model):
    from langgraph.types import RetryPolicy

    from nodes.kernel.provider_errors import is_transient

    default = make_config(model).retry
    assert default is not None and default.max_attempts == 3 and default.retry_on is is_transient
    mapped = make_config(model, retry={"max_attempts": 5, "jitter": False}).retry
    assert mapped == default._replace(max_attempts=5, jitter=False)
    own = RetryPolicy(max_attempts=2, retry_on=KeyError)
    assert make_config(model, retry=own).retry == own, "a policy of the caller's is used as given"
    assert make_config(model, retry=RetryPolicy()).retry.retry_on is is_transient, (
        "LangGraph's default retry_on knows no provider SDK errors"
    )
    assert make_config(model, retry=None).retry is None
    with pytest.raises(ValueError, match=r"retry: unknown argument\(s\) \['attempts'\]"):
        make_config(model, retry={"attempts": 3})
    with pytest.raises(ValueError, match="retry: max_attempts must be at least 1"):
        make_config(model, retry={"max_attempts": 0})
