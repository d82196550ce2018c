"""Hostile input, generated (issues 12, 19, 28): names, texts, content blocks, working
memory, contexts, odd token usage, and the door it comes through (a turn, a `Command`'s
update, a `goto`, `update_state`, or a resume of a failed group turn under any context).

Every model reply reports a drawn token usage (floats, NaN, `None`, past 2^63, …),
and the first round of each turn asks for the owner's `take_note` and the shared
`get_time`; the memory backend answers an unrestricted read with a persona's
private canary. For every generated run, on one long-lived graph per attribution
encoding:
- the run completes, or raises ValueError/TypeError before the model is called
  and with nothing stored (a caller's `goto` is always refused);
- the next ordinary turn of the same session succeeds, and its request renders
  with the provider's real formatter (offline);
- on a thread opened as a group or stranger: no request holds the canary or
  offers `take_note`, and `take_note` never runs;
- every `[发言归属]` note is one well-formed line, when only named speakers
  (third parties) spoke no note presents anything as the owner's, and every
  marker in system text starts a line the loop wrote (caller text inside system
  text is data);
- the transcript holds only human messages, the model's replies and tool results.

1,000 examples per encoding (2,000 in all), plus a cheap property that
admitting twice changes nothing.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.types import Command

from graph import SessionEnv, build_graph, open_checkpointer
from memory import MemoryItem, Scope
from memory.retrieval.ranking import SearchResult
from nodes.boundary.admission import admit
from nodes.context.layout import ROUND_STATE_NOTE, is_round_state
from tests import boundary_support as support
from tests.conftest import get_time, make_config, thread

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


DOORS = ("command", "goto", "update_state", "resume")
doors = mostly(st.just("invoke"), st.sampled_from(DOORS), 3)
"""How the input arrives: mostly as a turn, one run in three through a side door (a
resume continues a failed group turn under the drawn context)."""


@st.composite
def runs(draw: st.DrawFn) -> tuple[Any, Any, bool, str, Any]:
    """(turn input, context, whether the owner may have spoken, the door it comes through,
    the token usage every reply reports)."""
    context, door, usage = draw(contexts), draw(doors), draw(usages)
    if draw(mostly(st.just(False), st.just(True), 40)):
        odd = draw(st.sampled_from([42, "hi", [], {"messages": []}, {"x": 1}]))
        return odd, context, False, door, usage
    drawn = draw(st.lists(items, min_size=1, max_size=3))
    messages = [item for item, _ in drawn]
    turn: dict[str, Any] = {
        "messages": messages[0] if len(messages) == 1 and draw(st.booleans()) else messages
    }
    if draw(st.booleans()):
        turn["working_memory"] = draw(working_memories)
    if draw(mostly(st.just(False), st.just(True), 40)):
        turn[draw(st.sampled_from(["summary", "mood", "capacity"]))] = draw(texts)
    return turn, context, any(owner for _, owner in drawn), door, usage


odd_counts = st.one_of(
    st.integers(-5, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.sampled_from(["12", [], {}]),
)
usages = mostly(
    st.fixed_dictionaries(
        {"input_tokens": st.integers(0, 99), "output_tokens": st.integers(0, 9)}
    ).map(lambda u: {**u, "total_tokens": u["input_tokens"] + u["output_tokens"]}),
    st.one_of(
        st.dictionaries(
            st.sampled_from(["input_tokens", "output_tokens", "total_tokens"]), odd_counts
        ),
        st.fixed_dictionaries(
            {"input_tokens": st.just(1), "output_tokens": st.just(1), "total_tokens": st.just(2)},
            optional={
                "input_token_details": st.dictionaries(
                    st.sampled_from(["cache_read", "audio"]), odd_counts
                )
            },
        ),
        st.sampled_from([None, {}, 7, "lots", [1, 2]]),
    ),
    one_in=3,
)
"""What each reply reports: usually plain counts, one time in three anything a lenient
client might hand over."""


# -- the world ---------------------------------------------------------------------------

CANARY = "金丝雀-私密日记-4471"
OWNER_ONLY_RAN: set[str] = set()
"""Threads `take_note` ran on (it must never run on a group or stranger thread)."""


@tool
def take_note(text: str, config: RunnableConfig) -> str:
    """Append a note to the owner's notebook."""
    OWNER_ONLY_RAN.add(str(config["configurable"]["thread_id"]))
    return "已记下"


class Down(Exception):
    """The provider fails a turn (not transient): its message is stored, resumable."""


class CanaryMemory:
    """A memory backend whose every unrestricted read finds a persona's private canary."""

    private = MemoryItem(content=CANARY, kind="diary", scope=Scope.PERSONA, persona_id="xilian")
    shared = MemoryItem(content="主人喜欢喝茶", kind="habit", scope=Scope.USER)

    def search(self, query: str, persona_id=None, restricted=False, k=8) -> list[SearchResult]:
        found = [self.shared] if restricted else [self.private, self.shared]
        return [SearchResult(item, 1.0, 1.0, 1.0) for item in found][:k]

    def add_many(self, items) -> list[str]:
        return []


class HostileWorldModel(support.EndlessModel):
    """Asks for every tool it is offered on a turn's first round, then answers 好; each
    reply reports `usage`; `fail_next` fails the next request."""

    usage: Any = None
    fail_next: bool = False

    def _next(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        support.EndlessModel._next(self, messages, kwargs)
        if self.fail_next:
            self.fail_next = False
            raise Down("the provider is down")
        offered = [t["function"]["name"] for t in kwargs.get("tools", [])]
        wanted = [n for n in offered if n in ("take_note", "get_time")]
        first_round = not isinstance(messages[-1], ToolMessage) and not any(
            isinstance(m, ToolMessage) for m in messages[-3:]
        )
        calls = [
            {"name": n, "args": {"text": "x"} if n == "take_note" else {}, "id": f"c{i}"}
            for i, n in enumerate(wanted)
        ]
        reply = AIMessage("", tool_calls=calls) if calls and first_round else AIMessage("好")
        reply.usage_metadata = self.usage  # as a lenient provider client hands it over
        return reply


# -- the property ----------------------------------------------------------------------


def world_config(model: HostileWorldModel) -> Any:
    return make_config(
        model,
        tools=[take_note, get_time],
        restricted_tools={"get_time"},
        memory=CanaryMemory(),
    )


@pytest.fixture(scope="module")
def worlds():
    """One graph per attribution encoding, shared by every example (fresh thread each)."""
    with open_checkpointer("memory") as saver:
        yield {
            provider: (build_graph(world_config(model), saver), model)
            for provider, model in (
                ("openai", HostileWorldModel(provider="openai")),
                ("anthropic", HostileWorldModel(provider="anthropic")),
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
    elif door == "resume":
        graph.invoke(None, session, context=context)
    else:
        graph.update_state(session, turn)


def opening(graph: Any, model: HostileWorldModel, door: str, session: dict) -> None:
    """What a side door continues: a group turn, answered, or failed (for a resume)."""
    model.fail_next = door == "resume"
    try:
        graph.invoke({"messages": [HumanMessage("开场", name="小明")]}, session, context=GROUP)
    except Down:
        assert graph.get_state(session).next, "the failed turn is resumable"


def marker_lines_are_the_loops(view: list[BaseMessage]) -> None:
    """Every marker in the view's system text starts a line: caller text in system text is
    data (its brackets are full-width), so none of it can hold one."""
    text = "\n".join(m.text for m in view if isinstance(m, SystemMessage) or is_round_state(m))
    text = text.replace(ROUND_STATE_NOTE, "")  # the loop's own note quotes its markers
    lines = [support.INDEX_ENTRY.sub("", line) for line in text.split("\n")]
    for marker in support.LOOP_MARKERS:
        starts = sum(line.startswith(marker) for line in lines)
        assert text.count(marker) == starts, f"{marker} inside a line of system text: {text}"


def check_run(world: tuple[Any, Any], provider: str, case: tuple[Any, Any, bool, str, Any]) -> None:
    graph, model = world
    turn, context, owner_spoke, door, usage = case
    model.usage = usage
    session = thread(f"hostile-{next(_threads)}")
    before, stored_before = len(model.requests), None
    try:
        event(f"door: {door}")
        if door in ("command", "goto", "resume"):
            opening(graph, model, door, session)
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
    if door == "resume" and graph.get_state(session).next:
        follow_up = None  # refused: the next message comes unnamed, as the thread's own
    out = graph.invoke(
        {"messages": [HumanMessage("下一句", name="小明")]}, session, context=follow_up
    )
    assert out["messages"][-1].content == "好"
    assert all(
        isinstance(m, HumanMessage | ToolMessage)
        or (isinstance(m, AIMessage) and m.content in ("好", ""))
        for m in out["messages"]
    ), "the transcript holds only human messages, the model's replies and tool results"
    restricted = (out.get("opened_as") or {}).get("actor") in ("group", "stranger")
    if restricted:
        event("restricted thread")
        assert str(session["configurable"]["thread_id"]) not in OWNER_ONLY_RAN, "take_note ran"
    for request in model.requests[before:]:
        notes = support.notes_of(request.messages)
        assert all(support.WELL_FORMED_NOTE.fullmatch(note) for note in notes), notes
        marker_lines_are_the_loops(request.messages)
        if restricted:
            assert not any(CANARY in str(m.content) for m in request.messages), "canary seen"
            assert "take_note" not in request.tool_names, "the owner's tool was offered"
        if not owner_spoke:
            event("owner check")
            assert support.OWNER_NOTE not in notes, "a third party was presented as the owner"
    support.rendered(provider, model.requests[-1].messages)
    session_total = (out.get("token_usage") or {}).get("session") or {}
    assert all(
        isinstance(v, int) and 0 <= v < 2**63
        for v in session_total.values()
        if not isinstance(v, dict)
    ), session_total


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
    turn, context, *_ = case
    try:
        once, env = admit(turn, thread("t"), context)
    except (ValueError, TypeError):
        return
    assert admit(once, thread("t"), env) == (once, env)
