"""Turns from the CLI: a failing model, stable message ids, escaped output, chat commands."""

from __future__ import annotations

import threading

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

import studio.demo.world
from graph import Sessions, build_graph, open_checkpointer
from tests.cli_support import chat, cyrene, one_line_error
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel


def provider_down(messages: list[BaseMessage]) -> AIMessage:
    raise RuntimeError("provider down\nretry later")


def humans(capsys, data, session: str) -> list[str]:
    history = cyrene(capsys, "history", session, "--data", str(data))
    return [
        line.split(maxsplit=1)[1] for line in history.out.splitlines() if line.split()[0] == "human"
    ]


def test_a_failed_model_call_is_one_line_naming_resume_and_the_session_resumes(tmp_path, capsys):
    model = ScriptedChatModel(script=[provider_down, AIMessage("回来了")])
    data = ("--data", str(tmp_path))
    failed = cyrene(capsys, "run", "你好", "--session", "我的 会话", *data, model=model)
    assert failed.code == 75
    line = one_line_error(failed)
    assert "RuntimeError: provider down retry later" in line, "folded, not escaped"
    assert "`cyrene resume '我的 会话'`" in line, "a command to paste"
    assert humans(capsys, tmp_path, "我的 会话") == ["你好"], "the message is stored once"
    resumed = cyrene(capsys, "resume", "我的 会话", *data, model=model)
    assert resumed.code == 0, resumed.err
    assert resumed.out == "回来了\n"
    assert len(model.requests) == 2


class Refused(Exception):
    """What a provider SDK raises for a request it refuses (openai.BadRequestError's shape)."""

    status_code = 400


def provider_refuses(messages: list[BaseMessage]) -> AIMessage:
    raise Refused("Unsupported parameter: 'reasoning_effort'")


def test_a_refused_request_is_not_promised_a_resume_and_the_next_turn_sees_the_message(
    tmp_path, capsys
):
    model = ScriptedChatModel(script=[provider_refuses, AIMessage("早安")])
    data = ("--data", str(tmp_path), "--session", "s1")
    failed = cyrene(capsys, "run", "你好", *data, model=model)
    line = one_line_error(failed)
    assert failed.code == 2 and "cyrene resume" not in line, line
    assert "refused the turn's request (Refused: Unsupported parameter" in line
    assert len(model.requests) == 1, "not retried: it would be refused again"
    assert cyrene(capsys, "run", "在吗", *data, model=model).out == "早安\n"
    assert [m.text for m in model.requests[1].messages if m.type == "human"] == ["你好", "在吗"]


def test_resending_after_a_failure_does_not_duplicate_but_a_later_repeat_is_new(tmp_path, capsys):
    model = ScriptedChatModel(
        script=[provider_down, AIMessage("第一次回答"), AIMessage("第二次回答")]
    )
    data = ("--data", str(tmp_path), "--session", "s1")
    assert cyrene(capsys, "run", "在吗", *data, model=model).code == 75
    again = cyrene(capsys, "run", "在吗", *data, model=model)
    assert again.code == 0 and again.out == "第一次回答\n", again.err
    assert humans(capsys, tmp_path, "s1") == ["在吗"], "the re-sent text replaced the stored one"
    assert [m.type for m in model.requests[1].messages].count("human") == 1
    later = cyrene(capsys, "run", "在吗", *data, model=model)
    assert later.code == 0 and later.out == "第二次回答\n"
    assert humans(capsys, tmp_path, "s1") == ["在吗", "在吗"], "asked again after an answer: new"


def test_control_characters_are_shown_escaped(tmp_path, capsys):
    hostile = "\x1b]0;pwned\x07\x1b[2J看\u202eevil\u2066x\x9b31m\r"
    model = ScriptedChatModel(script=[AIMessage(f"回声：{hostile}\n第二行")] * 2)
    data = ("--data", str(tmp_path))
    run = cyrene(capsys, "run", hostile, "--session", "s1", *data, model=model)
    history = cyrene(capsys, "history", "s1", *data)
    chatted = chat(capsys, tmp_path, "s2", hostile + "\n", model=model)
    for out in (run.out, history.out, chatted.out):
        assert not set(out) & set("\x1b\x07\u202e\u2066\x9b\r"), repr(out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J看\\u202eevil\\u2066x\\x9b31m\\x0d" in out
    assert run.out.endswith("第二行\n") and "\\x0d\n第二行" in run.out, "newlines stay"
    assert "\\x1b[2J看" in history.out.splitlines()[0], "the human message too"


def test_chat_refuses_an_unknown_actor_or_persona_and_goes_on(tmp_path, capsys):
    typed = (
        "/actor root\n你好\n/persona nobody\n/persona\n/actor group\n大家好\n"
        "/session cg\n大家好\n/quit\n"
    )
    out = chat(capsys, tmp_path, "c", typed)
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    assert (
        "unknown actor 'root'; choose one of: owner, group, stranger, internal (now: owner)"
        in lines
    )
    assert "unknown persona 'nobody'; choose one of: aglaea, xilian (now: xilian)" in lines
    assert "choose one of: aglaea, xilian (now: xilian)" in lines
    assert "昔涟：收到「你好」" in out.out and "收到「大家好」" in out.out
    assert "thread 'c' was opened as 'owner'; a run on it cannot be 'group'" in out.err, (
        "a session is what it was opened as: the group's line needs a session of its own"
    )
    history = cyrene(capsys, "history", "c", "--data", str(tmp_path)).out.splitlines()
    assert [line.split()[0] for line in history] == ["human", "ai(xilian)"]
    group = cyrene(capsys, "history", "cg", "--data", str(tmp_path)).out.splitlines()
    assert [line.split()[0] for line in group] == ["human", "ai"], "a group turn (unlabelled)"


def test_a_busy_session_is_one_line_and_stores_nothing(tmp_path, capsys, monkeypatch):
    real = studio.demo.world.demo_config
    monkeypatch.setattr(
        studio.demo.world,
        "demo_config",
        lambda data, model=None, **settings: real(data, model, **settings).with_features(
            Sessions(busy_policy="reject")
        ),
    )
    started, answered = threading.Event(), threading.Event()

    def slow(messages: list[BaseMessage]) -> AIMessage:
        started.set()
        answered.wait(30)  # held until the CLI has had its answer, however long it loads
        return AIMessage("慢慢说")

    def another_process_s_turn() -> None:
        with open_checkpointer(f"sqlite:///{tmp_path / 'checkpoints.db'}") as saver:
            graph = build_graph(make_config(ScriptedChatModel(script=[slow])), saver)
            graph.invoke({"messages": [HumanMessage("先来", id="first")]}, thread("s"))

    holder = threading.Thread(target=another_process_s_turn)
    holder.start()
    assert started.wait(30)
    busy = cyrene(capsys, "run", "后到", "--session", "s", "--data", str(tmp_path))
    answered.set()
    holder.join()
    assert busy.code == 2
    assert "session 's' is busy" in one_line_error(busy)
    assert humans(capsys, tmp_path, "s") == ["先来"]


def test_group_reply_mentioned_answers_a_group_only_when_it_names_her(tmp_path, capsys):
    model = ScriptedChatModel(script=[AIMessage("在呢")])
    group = ("--session", "g", "--actor", "group", "--name", "小明", "--data", str(tmp_path))
    quiet = [cyrene(capsys, "run", "哈哈", *group, "--group-reply", "mentioned", model=model)]
    quiet.append(cyrene(capsys, "--group-reply", "mentioned", "run", "哈哈", *group, model=model))
    named = cyrene(capsys, "run", "昔涟在吗", *group, "--group-reply", "mentioned", model=model)
    always = cyrene(
        capsys, "run", "哈哈", *group, model=ScriptedChatModel(script=[AIMessage("嗯")])
    )
    assert [q.out for q in quiet] == [
        "（没有回应：not addressed (no name, nickname or platform mention)）\n"
    ] * 2
    assert named.out == "在呢\n" and len(model.requests) == 1
    assert always.out == "嗯\n", "without the option, the demo world answers every group turn"
    history = cyrene(capsys, "history", "g", "--data", str(tmp_path)).out.splitlines()
    assert [line.split() for line in history] == [
        ["human(小明)", "哈哈"],
        ["human(小明)", "哈哈"],
        ["human(小明)", "昔涟在吗"],
        ["ai", "在呢"],
        ["human(小明)", "哈哈"],
        ["ai", "嗯"],
    ], "the same words said again after a quiet turn are a new message"
