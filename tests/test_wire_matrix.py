"""Issue 32, "Done when": over a matrix of what broke on the wire (a history imported twice, a
fallback of the other family in the middle of a tool round, cut-off streams, malformed bodies),
on both providers, through the real clients against the emulator: no thread is left unable to
answer, and no user message is lost or stored twice.

Each case runs a turn that meets the trouble (it may fail for good: the faults here outlast the
3 attempts), then the session's next message, and checks the whole transcript after it.
"""

# ruff: noqa: F811  (the fixtures are imported from tests.emulator.fixtures, then used as parameters)

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from graph import Fallbacks, Persona, Trusted, build_graph, open_checkpointer
from nodes.kernel.transcript import pending_tool_calls
from tests.conftest import make_config, thread
from tests.emulator import (
    BadSseLine,
    CutAfterToolName,
    CutStream,
    Emulator,
    Html,
    Reply,
    Status,
    call,
)
from tests.emulator.fixtures import client, emulator, offline_tokenizer  # noqa: F401
from tests.emulator.traffic import traffic_problems
from tests.test_provider_wire import FAST_RETRY, IMPORTED, refused

OTHER = {"openai": "anthropic", "anthropic": "openai"}
THINKING = {"xilian": Persona(name="昔涟", instructions="你是昔涟。", thinking_budget=2048)}
RUNS: list[str] = []


@tool
def take_note(text: str) -> str:
    """Write a note down."""
    RUNS.append(text)
    return "已记下"


Case = Callable[[Emulator, str, Any], Any]
"""Sets the trouble up on the emulator and returns the graph (given the saver)."""


def imported_twice(api: Emulator, provider: str, saver: Any) -> Any:
    graph = build_graph(make_config(client(api, provider), retry=FAST_RETRY), saver)
    for _ in range(2):
        graph.invoke(Trusted({"messages": IMPORTED}), thread("m"))
    return graph


def fallback_mid_tool_round(api: Emulator, provider: str, saver: Any) -> Any:
    api.reply(call("take_note", text="买花"), Reply("记好了。"))
    # After the call, the persona's provider fails for good; the other family takes over.
    api.inject(Status(500), times=None, when=lambda r: r.provider == provider and r.number > 1)
    fallback = Fallbacks(models=[client(api, OTHER[provider])])
    config = make_config(
        client(api, provider),
        tools=[take_note],
        personas=THINKING,
        retry=FAST_RETRY,
        features=[fallback],
    )
    return build_graph(config, saver)


def faulted(fault: Any) -> Case:
    def case(api: Emulator, provider: str, saver: Any) -> Any:
        api.reply(call("take_note", text="买花"))
        api.inject(fault, times=3)  # every attempt of the turn's first request
        config = make_config(client(api, provider), tools=[take_note], retry=FAST_RETRY)
        return build_graph(config, saver)

    return case


CASES: dict[str, Case] = {
    "imported twice": imported_twice,
    "fallback mid tool round": fallback_mid_tool_round,
    "cut-off stream": faulted(CutStream()),
    "stream cut after a tool name": faulted(CutAfterToolName()),
    "gateway HTML page": faulted(Html()),
    "broken SSE line": faulted(BadSseLine()),
}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("case", list(CASES))
def test_no_thread_is_left_unable_to_answer_and_no_message_is_lost_or_doubled(
    emulator, provider, case
):
    RUNS.clear()
    said = ["把买花记下来", "在吗"]
    with open_checkpointer("memory") as saver:
        graph = CASES[case](emulator, provider, saver)
        streamed = {"stream_mode": "messages"}
        try:
            for _ in graph.stream({"messages": [HumanMessage(said[0])]}, thread("m"), **streamed):
                pass
        except Exception:  # the trouble outlasted the attempts: the next message must work
            pass
        emulator.reply(Reply("在的。"))
        for _ in graph.stream({"messages": [HumanMessage(said[1])]}, thread("m"), **streamed):
            pass
        messages = graph.get_state(thread("m")).values["messages"]
    assert messages[-1].text == "在的。", "the thread answers"
    humans = Counter(m.text for m in messages if isinstance(m, HumanMessage))
    assert all(humans[text] == 1 for text in said), f"each message once: {humans}"
    assert pending_tool_calls(messages) == [], "no call left unanswered"
    assert RUNS in ([], ["买花"]), "a call runs once, or never (cut off: never)"
    assert refused(emulator) == [] and traffic_problems(emulator.requests) == {}
