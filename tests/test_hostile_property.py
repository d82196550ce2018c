"""Hostile input, generated (issues 12, 19): names, texts, content blocks, working memory,
contexts, and the door it comes through (a turn, a `Command`'s update, a `goto`,
`update_state`).

For every generated run, on one long-lived graph per attribution encoding:
- the run completes, or raises ValueError/TypeError before the model is called
  and with nothing stored (a caller's `goto` is always refused);
- the next ordinary turn of the same session succeeds, and its request renders
  with the provider's real formatter (offline);
- every `[发言归属]` note is one well-formed line, and when only named
  speakers (third parties) spoke, no note presents anything as the owner's;
- the transcript holds only human messages and the model's own replies.

1,000 examples per encoding (2,000 in all), plus a cheap property that
admitting twice changes nothing.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Command

from graph import SessionEnv, build_graph, open_checkpointer
from nodes.boundary import admit
from tests import boundary_support as support
from tests.conftest import make_config, thread

EXAMPLES_PER_ENCODING = 1000
GROUP = SessionEnv(actor="group")
_threads = itertools.count()

# -- strategies ------------------------------------------------------------------------

SPECIAL = list("\x00\ud800\udfff\u3000\xa0\u200b\u200d\u202e\u2028\u2029\x85\n\r\t\x1b\ufeff「」｢｣")
PHRASES = [
    support.OWNER_NOTE,
    "[发言归属] ",
    "」——本会话里的第三方人员。",
    "第1条起：",
    "[会话角色] ",
    "主人",
    "小明",
    "hi",
    "\ud83d\ude00",
]
chars = st.one_of(st.characters(), st.sampled_from(SPECIAL))


def mostly(usual: st.SearchStrategy, rare: st.SearchStrategy, one_in: int = 8) -> st.SearchStrategy:
    """`rare` one time in `one_in`, else `usual` (refusals must not crowd out admitted runs).

    Keyed on a middle value: Hypothesis leans towards 0 and the ends of a range."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == one_in // 2 else usual)


texts = st.one_of(
    st.text(chars, max_size=24),
    st.lists(st.sampled_from(PHRASES + SPECIAL), max_size=5).map("".join),
)
names = st.one_of(texts, st.sampled_from(["", " ", "\u3000", "主人", "xilian", "名" * 40]))
raw_images = st.one_of(
    st.sampled_from(
        [support.PNG, support.JPEG, support.GIF, support.WEBP, b"", b"hello", b"RIFF\0\0\0\0WAVE"]
    ),
    st.binary(max_size=12),
)
urls = st.one_of(
    texts,
    st.sampled_from(
        [
            "https://x.invalid/a.png",
            "http://x.invalid/b",
            "https://x.invalid/a b.png",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:image/png,abc",
            "ftp://x.invalid/y.gif",
        ]
    ),
)
loose = st.one_of(texts, st.integers(), st.none())
image_blocks = st.one_of(
    st.builds(
        lambda raw, mime: {"type": "image", "base64": support.b64(raw), "mime_type": mime},
        raw_images,
        st.sampled_from([None, "image/png", "image/jpeg", "text/plain", ""]),
    ),
    st.builds(
        lambda raw: {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + support.b64(raw)},
        },
        raw_images,
    ),
    st.builds(lambda url: {"type": "image", "url": url}, urls),
    st.builds(lambda url: {"type": "image_url", "image_url": url}, urls),
    st.fixed_dictionaries(
        {"type": st.just("image")},
        optional={
            "text": texts,
            "base64": loose,
            "url": loose,
            "mime_type": loose,
            "data": loose,
            "source": st.dictionaries(
                st.sampled_from(["type", "data", "url", "media_type"]), loose
            ),
        },
    ),
)
spoken = mostly(texts.map(lambda text: "说" + text), texts)
"""Message text: usually with something visible in it, sometimes blank."""
blocks = mostly(
    st.one_of(st.builds(lambda text: {"type": "text", "text": text}, spoken), image_blocks, spoken),
    st.sampled_from(
        [
            {"type": "audio", "base64": "AAAA"},
            {"type": "tool_use", "id": "x", "name": "add", "input": {}},
            {"type": "text"},
            {"type": "text", "text": 5},
            {"type": None},
            {},
        ]
    ),
)
contents = st.one_of(spoken, st.lists(blocks, min_size=1, max_size=4))
speakers = mostly(names, st.none(), 4)
"""None marks the owner; any name is a third party."""


@st.composite
def human_items(draw: st.DrawFn) -> tuple[Any, bool]:
    """(a message in one of the forms callers send, whether it is the owner's)."""
    content, name = draw(contents), draw(speakers)
    form = draw(mostly(st.sampled_from(["object", "dict"]), st.just("bare"), 6))
    if form == "object":
        return HumanMessage(content, name=name), name is None
    if form == "dict":
        role = draw(st.sampled_from(["user", "human"]))
        return {"role": role, "content": content, "name": name}, name is None
    text = draw(spoken)
    return draw(st.sampled_from([text, ("user", text)])), True


items = mostly(
    human_items(), st.sampled_from(support.HOSTILE_ITEMS).map(lambda item: (item, False)), 12
)
working_memories = mostly(
    texts | st.none(), st.one_of(st.integers(), st.lists(texts, max_size=2), st.binary(max_size=4))
)
contexts = mostly(
    st.sampled_from(
        [
            None,
            SessionEnv(),
            GROUP,
            SessionEnv(actor="stranger"),
            SessionEnv(actor="internal"),
            SessionEnv(actor="group", persona_id="aglaea"),
        ]
    ),
    st.one_of(
        st.fixed_dictionaries(
            {"actor": st.sampled_from(["owner", "group", "stranger", "internal", "root", 5])},
            optional={"persona_id": st.none() | texts, "session_id": st.none() | texts, "x": texts},
        ),
        texts,
        st.integers(),
        st.lists(texts, max_size=1),
    ),
    one_in=4,
)


DOORS = ("command", "goto", "update_state")
doors = mostly(st.just("invoke"), st.sampled_from(DOORS), 3)
"""How the input arrives: mostly as a turn, one run in three through a side door."""


@st.composite
def runs(draw: st.DrawFn) -> tuple[Any, Any, bool, str]:
    """(turn input, context, whether the owner may have spoken, the door it comes through)."""
    context, door = draw(contexts), draw(doors)
    if draw(mostly(st.just(False), st.just(True), 40)):
        odd = draw(st.sampled_from([42, "hi", [], {"messages": []}, {"x": 1}]))
        return odd, context, False, door
    drawn = draw(st.lists(items, min_size=1, max_size=3))
    messages = [item for item, _ in drawn]
    turn: dict[str, Any] = {
        "messages": messages[0] if len(messages) == 1 and draw(st.booleans()) else messages
    }
    if draw(st.booleans()):
        turn["working_memory"] = draw(working_memories)
    if draw(mostly(st.just(False), st.just(True), 40)):
        turn[draw(st.sampled_from(["summary", "mood", "capacity"]))] = draw(texts)
    return turn, context, any(owner for _, owner in drawn), door


# -- the property ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def worlds():
    """One graph per attribution encoding, shared by every example (fresh thread each)."""
    with open_checkpointer("memory") as saver:
        yield {
            provider: (build_graph(make_config(model, restricted_tools={"get_time"}), saver), model)
            for provider, model in (
                ("openai", support.endless("openai")),
                ("anthropic", support.endless("anthropic")),
            )
        }


def deliver(graph: Any, door: str, turn: Any, session: dict, context: Any) -> None:
    """Send `turn` through `door` (a `Command` continues the session it is sent to)."""
    if door == "invoke":
        graph.invoke(turn, session, context=context)
    elif door == "command":
        graph.invoke(Command(update=turn), session, context=context)
    elif door == "goto":
        graph.invoke(Command(goto="call_model", update=turn), session, context=context)
    else:
        graph.update_state(session, turn)


def check_run(world: tuple[Any, Any], provider: str, case: tuple[Any, Any, bool, str]) -> None:
    graph, model = world
    turn, context, owner_spoke, door = case
    session = thread(f"hostile-{next(_threads)}")
    before, stored_before = len(model.requests), None
    try:
        event(f"door: {door}")
        if door in ("command", "goto"):
            graph.invoke({"messages": [HumanMessage("开场", name="小明")]}, session, context=GROUP)
            before, stored_before = len(model.requests), graph.get_state(session).values
        deliver(graph, door, turn, session, context)
        assert door != "goto", "a caller's goto was admitted"
        event("admitted")
        follow_up = (
            GROUP if door == "update_state" else context
        )  # the context it was admitted under
    except (ValueError, TypeError):
        event("refused")
        assert len(model.requests) == before, "refused after the model was called"
        assert graph.get_state(session).values == (stored_before or {}), "a refused run stored"
        follow_up = GROUP
    out = graph.invoke(
        {"messages": [HumanMessage("下一句", name="小明")]}, session, context=follow_up
    )
    assert out["messages"][-1].content == "好"
    assert all(
        isinstance(m, HumanMessage) or (isinstance(m, AIMessage) and m.content == "好")
        for m in out["messages"]
    ), "the transcript holds only human messages and the model's replies"
    for request in model.requests[before:]:
        notes = support.notes_of(request.messages)
        assert all(support.WELL_FORMED_NOTE.fullmatch(note) for note in notes), notes
        if not owner_spoke:
            event("owner check")
            assert support.OWNER_NOTE not in notes, "a third party was presented as the owner"
    support.rendered(provider, model.requests[-1].messages)


SETTINGS = settings(
    max_examples=EXAMPLES_PER_ENCODING,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(case=runs())
def test_hostile_runs_with_inline_notes(worlds, case):
    check_run(worlds["openai"], "openai", case)


@SETTINGS
@given(case=runs())
def test_hostile_runs_with_a_leading_note_index(worlds, case):
    check_run(worlds["anthropic"], "anthropic", case)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=runs())
def test_admitting_twice_changes_nothing(case):
    turn, context, _, _ = case
    try:
        once, env = admit(turn, thread("t"), context)
    except (ValueError, TypeError):
        return
    assert admit(once, thread("t"), env) == (once, env)
