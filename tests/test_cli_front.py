"""The front door: what a newcomer meets in the first minutes of `cyrene` (issue 23).

Listing sessions, printing the graph, refusing a persona or an actor that does
not exist, chat commands answered locally, the environment variables, help
for every option, and failures that are one line and exit 2 (or 1: not found).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from langchain_core.messages import AIMessage

import studio.cli.serve
from graph import Compaction, TurnEnd, build_graph, open_checkpointer
from graph.storage import DEFAULT_KEEP
from graph.storage.reading import read_session
from memory import Scope
from nodes.core.env import Actor
from nodes.presence.settings import GroupReply
from studio.cli import main as cli
from studio.cli import memory as cli_memory
from studio.cli.read import loop_drawing
from tests.cli_support import chat, cyrene, cyrene_process, one_line_error
from tests.conftest import REPO, make_config, thread
from tests.scripted import ScriptedChatModel, call, tool_calls

HEAVY = ("chromadb", "langchain", "langchain_core", "langgraph", "pydantic")


def test_help_loads_none_of_the_loop():
    """`cyrene --help` and every usage error answer before chromadb, LangChain, LangGraph
    (or pydantic) are imported: they take most of a second (bench: tests/bench/cli.py)."""
    code = (
        "import sys\n"
        "from studio.cli.main import main\n"
        "for argv in (['--help'], ['memory', 'import', '--help'], ['run', 'x', '--actor', 'x']):\n"
        "    main(argv)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip().endswith("[]"), out.stdout + out.stderr


def test_the_clis_copies_of_the_loops_choices_agree():
    assert get_args(Actor) == cli.ACTORS and get_args(GroupReply) == cli.GROUP_REPLIES
    assert set(cli_memory.SCOPES) == {scope.value for scope in Scope}
    assert cli.DEFAULT_KEEP == DEFAULT_KEEP


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {where}", a) for where, a in _options(sub)]
        elif not isinstance(action, argparse._HelpAction):
            found.append((action.dest, action))
    return found


def test_every_option_has_help_text():
    missing = [where for where, action in _options(cli.parser()) if not action.help]
    assert missing == []


def test_the_import_format_is_documented_in_its_help(capsys):
    shown = cyrene(capsys, "memory", "import", "--help")
    assert shown.code == 0
    shown = shown.out
    assert '{"content": "主人养了一只猫叫团子", "kind": "fact", "scope": "user"}' in shown
    assert "persona_id (required with scope persona)" in shown


def test_memory_s_persona_option_says_it_has_no_default(capsys):
    """A turn answers as xilian unless told; `cyrene memory` has no persona unless told,
    and `memory add --scope persona` without one is refused."""
    for argv in (["memory", "--help"], ["memory", "add", "--help"]):
        shown = " ".join(cyrene(capsys, *argv).out.split())
        assert "--persona PERSONA the persona a `--scope persona` memory belongs to" in shown
        assert "xilian (default)" not in shown
    assert "xilian (default)" in " ".join(cyrene(capsys, "run", "--help").out.split())


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["run", "hi", "--persona", "nosuch"],
            "unknown persona 'nosuch'; choose one of: aglaea, xilian",
        ),
        (
            ["chat", "--persona", "nosuch"],
            "unknown persona 'nosuch'; choose one of: aglaea, xilian",
        ),
        (["run", "hi", "--actor", "root"], "invalid choice: 'root' (choose from 'owner', 'group'"),
        (["studio", "--port", "99999"], "invalid port '99999': a number from 1 to 65535"),
        (["memory", "add", ""], "cyrene: content: must not be empty"),
        (["memory", "add", "x", "--scope", "nobody"], "invalid choice: 'nobody'"),
        (["--memory-server", "nohost", "memory", "list"], "expected HOST:PORT"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_nothing_runs(tmp_path, capsys, argv, says):
    out = cyrene(capsys, *argv, "--data", str(tmp_path / "data"))
    assert out.code == 2
    assert says in one_line_error(out)
    assert not (tmp_path / "data" / "checkpoints.db").exists(), "no turn ran"


def test_an_unknown_persona_answers_nothing(tmp_path, capsys):
    model = ScriptedChatModel(script=[AIMessage("不该回答")])
    out = cyrene(capsys, "run", "hi", "--persona", "nosuch", "--data", str(tmp_path), model=model)
    assert out.code == 2 and model.requests == []


def test_chat_answers_its_own_commands_and_sends_the_rest(tmp_path, capsys):
    model = ScriptedChatModel(script=[AIMessage("在")])
    out = chat(capsys, tmp_path, "c", "/help\n/nosuch\n/persona nobody\n在吗\n/quit\n", model=model)
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    assert lines.count(cli_turns_help()) == 2, "printed at the start and for /help"
    assert "unknown command /nosuch; /help lists them" in lines
    assert "unknown persona 'nobody'; choose one of: aglaea, xilian (now: xilian)" in lines
    assert [r.texts[-1] for r in model.requests] == [("human", "在吗")], "only the message"


def cli_turns_help() -> str:
    from studio.cli.turns import CHAT_HELP

    return CHAT_HELP


def test_sessions_lists_each_with_activity_messages_and_tokens(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    usage = {"input_tokens": 120, "output_tokens": 8, "total_tokens": 128}
    model = ScriptedChatModel(
        script=[
            tool_calls(call("get_time", "c1")),
            AIMessage("八点半", usage_metadata=usage),
            AIMessage("嗯"),
        ]
    )
    assert cyrene(capsys, "run", "几点了", "--session", "timed", *data, model=model).code == 0
    assert cyrene(capsys, "run", "你好", "--session", "plain", *data, model=model).code == 0
    out = cyrene(capsys, "sessions", *data)
    assert out.code == 0, out.err
    first, second = [line.split("  ") for line in out.out.splitlines()]
    assert first[0] == "plain" and second[0] == "timed", "the most recent first"
    assert first[2] == "2 messages" and len(first) == 3, "no tokens reported: none shown"
    assert second[2:] == ["4 messages", "input 120", "output 8", "total 128"]
    assert first[1].endswith(" UTC") and first[1] >= second[1]


def test_the_reader_sees_what_get_state_sees(tmp_path, capsys):
    """`history` and `sessions` rebuild the state from the checkpoint alone
    (graph.storage.reading): the same messages and values as the graph's own load,
    through tool rounds, the turn-end rewrite of a reply and a compaction."""
    model = ScriptedChatModel(
        script=[tool_calls(call("get_time", "c1")), *[AIMessage("嗯" * 40)] * 12]
    )
    config = make_config(
        model, features=[Compaction(max_context_tokens=300), TurnEnd(hook=lambda *a: "平静")]
    )
    with open_checkpointer(f"sqlite:///{tmp_path / 'c.db'}") as saver:
        graph = build_graph(config, saver)
        for i in range(8):
            graph.invoke({"messages": [("user", f"第{i}句 " + "话" * 30)]}, thread("s"))
        state = graph.get_state(thread("s")).values
        stored = read_session(saver, "s")
        whole = graph.transcript(thread("s"))
    assert state["archived"]["messages"] > 0, "compaction moved messages to the archive"
    assert stored.values["messages"] == state["messages"]
    assert stored.values["summary"] == state["summary"]
    assert stored.message_count == len(whole)
    history = cyrene(capsys, "history", "s", "--checkpoint", f"sqlite:///{tmp_path / 'c.db'}")
    assert len(history.out.splitlines()) == len(whole), "the archive and the window"


def test_graph_prints_the_mermaid_drawing(capsys):
    out = cyrene(capsys, "graph")
    assert out.code == 0 and out.out.strip() == loop_drawing()
    assert "call_model -.-> dispatch_tools;" in out.out


def test_prune_on_an_unknown_session_is_not_found_like_history(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    assert cyrene(capsys, "run", "你好", "--session", "s1", *data).code == 0
    for argv in (["prune", "nosuch"], ["history", "nosuch"]):
        out = cyrene(capsys, *argv, *data)
        assert out.code == 1 and one_line_error(out) == "cyrene: no session 'nosuch'"


def test_a_missing_data_folder_is_named_as_such(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "dir"
    reads = (["history", "s1"], ["sessions"], ["prune"])
    # Issue 32 finding 10: the memory reads made an empty store in the missing folder.
    memory_reads = (["memory", "list"], ["memory", "search", "猫"], ["memory", "export"])
    for argv in (*reads, *memory_reads, ["memory", "history", "m1"]):
        out = cyrene(capsys, "--data", str(missing), *argv)
        assert out.code == 1
        assert one_line_error(out) == f"cyrene: --data {missing}: no such folder"
    assert not missing.exists()


def test_a_sqlite_url_whose_folder_is_missing_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cyrene(capsys, "run", "hi", "--checkpoint", "sqlite:///nonexistent/dir/x.db")
    assert out.code == 2
    line = one_line_error(out)
    assert "no folder nonexistent/dir (relative to the current folder" in line
    assert "sqlite:////x.db absolute" in line
    assert not (tmp_path / "nonexistent").exists()


def test_environment_variables_set_every_commands_defaults(tmp_path, capsys, monkeypatch):
    data = tmp_path / "from-env"
    monkeypatch.setenv("CYRENE_DATA", str(data))
    monkeypatch.chdir(tmp_path)
    assert cyrene(capsys, "run", "你好", "--session", "e").code == 0
    assert (data / "checkpoints.db").exists() and not (tmp_path / ".cyrene").exists()
    assert cyrene(capsys, "history", "e").out.splitlines()[0].split() == ["human", "你好"]
    assert cyrene(capsys, "sessions").out.startswith("e  ")
    assert cyrene(capsys, "memory", "add", "团子是一只猫").code == 0
    assert "团子" in cyrene(capsys, "memory", "list").out
    assert (data / "memory").is_dir()
    other = tmp_path / "other.db"
    monkeypatch.setenv("CYRENE_CHECKPOINT", f"sqlite:///{other}")
    monkeypatch.setenv("CYRENE_GROUP_REPLY", "mentioned")
    quiet = cyrene(capsys, "run", "哈哈", "--actor", "group", "--name", "小明", "--session", "g")
    assert quiet.out.startswith("（没有回应：not addressed"), quiet.out + quiet.err
    assert read_session_ids(other) == ["g"], "the checkpoint URL came from the environment"
    monkeypatch.setenv("CYRENE_MODEL", "nosuchprovider:x")  # (cyrene() itself unsets it)
    assert cli.main(["run", "hi"]) == 2
    assert "cannot load chat model 'nosuchprovider:x'" in capsys.readouterr().err
    args = cli.parser().parse_args(["--memory-server", "127.0.0.1:1", "history", "x"])
    assert args.memory_server == "127.0.0.1:1"
    monkeypatch.setenv("CYRENE_MEMORY_SERVER", "10.0.0.1:8000")
    assert cli.parser().parse_args(["memory", "list"]).memory_server == "10.0.0.1:8000"


def test_a_bad_choice_from_the_environment_names_the_variable(tmp_path, capsys, monkeypatch):
    """argparse checks choices only on the command line: a bad $CYRENE_GROUP_REPLY reached the
    loop and came back as `reply: Input should be …`, naming neither option nor variable."""
    monkeypatch.setenv("CYRENE_GROUP_REPLY", "bogus")
    assert cli.main(["run", "x", "--data", str(tmp_path), "--actor", "group"]) == 2
    assert "--group-reply [CYRENE_GROUP_REPLY]: 'bogus' is not one of" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints.db").exists(), "nothing ran"


def read_session_ids(db: Path) -> list[str]:
    with open_checkpointer(f"sqlite:///{db}") as saver:
        return [t for t in ("g", "e") if read_session(saver, t) is not None]


def test_studio_without_its_extra_says_what_to_install_before_any_url(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(studio.cli.serve, "langgraph_binary", lambda: None)
    out = cyrene(capsys, "studio", "--data", str(tmp_path))
    assert out.code == 2 and out.out == "", "no URL printed"
    line = one_line_error(out)
    assert line.startswith("cyrene: cyrene studio needs the studio extra (langgraph-cli): ")
    assert line.endswith("-m pip install -e '.[studio]'"), "the command for a clone"


def test_tracing_without_its_extra_says_what_to_install(tmp_path, capsys, monkeypatch):
    """The OpenTelemetry SDK comes with chromadb, the LangChain instrumentor only with the
    `otel` extra: without it, an endpoint set means one line naming the extra, exit 2."""
    import builtins

    real_import = builtins.__import__

    def without_openinference(name, *args, **kwargs):
        if name.startswith("openinference"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_openinference)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    out = cyrene(capsys, "run", "现在几点？", "--data", str(tmp_path))
    assert out.code == 2
    assert one_line_error(out).startswith(
        "cyrene: OTEL_EXPORTER_OTLP_ENDPOINT (tracing) needs the otel extra: "
    )


def test_studio_prints_the_port_it_serves_on_when_the_asked_one_is_taken(
    tmp_path, capsys, monkeypatch
):
    """Issue 32 finding 10: with 2024 taken, `langgraph dev` moved to another port while
    `cyrene studio` printed `:2024`."""
    import socket
    from types import SimpleNamespace

    ran: list[list[str]] = []
    monkeypatch.setattr(studio.cli.serve, "langgraph_binary", lambda: "langgraph")
    server = SimpleNamespace(address="127.0.0.1:1")
    monkeypatch.setattr(studio.cli.serve, "start_server", lambda data: (None, server))
    monkeypatch.setattr(studio.cli.serve, "stop_server", lambda data, process: None)
    monkeypatch.setattr(
        studio.cli.serve, "_run_until_stopped", lambda command, env: ran.append(command) or 0
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        out = cyrene(capsys, "studio", "--port", str(busy), "--data", str(tmp_path))
    assert out.code == 0, out.err
    served = int(ran[0][ran[0].index("--port") + 1])
    assert served != busy
    assert f"http://127.0.0.1:{served}  (docs at /docs)" in out.out
    assert f":{busy}" not in out.out
    assert f"cyrene: port {busy} is in use; serving on {served}" in out.err


def test_a_reader_that_stops_early_ends_the_listing_quietly(tmp_path, capsys):
    """Issue 32 finding 10: `cyrene sessions | head` ended in a BrokenPipeError traceback."""
    assert cyrene(capsys, "run", "你好", "--data", str(tmp_path)).code == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    listing = subprocess.Popen(
        [sys.executable, "-m", "studio.cli.main", "sessions", "--data", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.close()  # gone before the first line is written
    err = listing.stderr.read().decode()
    assert listing.wait(timeout=120) == 0, err
    assert err == ""


def test_the_demo_names_each_persona_the_same_way_everywhere(tmp_path):
    out = cyrene_process("demo", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    speakers = {
        line.split("：")[0].strip() for line in out.stdout.splitlines() if "：（演示模型）" in line
    }
    assert speakers == {"昔涟", "阿格莱雅"}, speakers
    assert "xilian：" not in out.stdout


def test_a_long_library_error_is_folded_whole(tmp_path, capsys):
    def down(messages):
        raise RuntimeError("upstream said:\n\tline one\n\tline two " + "很长的原因 " * 80)

    out = cyrene(
        capsys, "run", "hi", "--data", str(tmp_path), model=ScriptedChatModel(script=[down])
    )
    line = one_line_error(out)
    assert "\\n" not in line and "\\t" not in line and "upstream said: line one line two" in line
    assert line.endswith("`cyrene resume default` finishes the turn"), "the advice is whole"


def test_a_memory_server_record_left_by_a_killed_studio_is_ignored(tmp_path, capsys):
    from studio.memory_server import RECORD

    (tmp_path / RECORD).write_text(json.dumps({"host": "127.0.0.1", "port": 1, "pid": 999999}))
    added = cyrene(capsys, "memory", "add", "团子是一只猫", "--data", str(tmp_path))
    assert added.code == 0, added.err
    assert (tmp_path / "memory" / "chroma.sqlite3").exists(), "the embedded store was used"


@pytest.mark.slow
def test_memory_commands_use_a_chroma_server_when_given_one(tmp_path, capsys):
    """`--memory-server HOST:PORT` (`$CYRENE_MEMORY_SERVER`): the memories live on that server,
    and the data folder gets no embedded store."""
    from studio.memory_server import start_server, stop_server

    served = tmp_path / "served"
    served.mkdir()
    process, server = start_server(served)
    try:
        data = ("--data", str(tmp_path / "data"), "--memory-server", server.address)
        added = cyrene(capsys, "memory", "add", "主人的猫叫团子", *data)
        assert added.code == 0, added.err
        assert "团子" in cyrene(capsys, "memory", "list", *data).out
        turn = cyrene(capsys, "run", "记住 周末去爬山", *data)
        assert turn.code == 0, turn.err
        assert "周末去爬山" in cyrene(capsys, "memory", "list", *data).out
    finally:
        stop_server(served, process)
    assert not (tmp_path / "data" / "memory").exists()
    assert (served / "memory" / "chroma.sqlite3").exists(), "the server wrote its own folder"


def test_a_data_folder_with_no_sessions_yet_says_so_and_blames_no_flag(tmp_path, capsys):
    assert cyrene(capsys, "memory", "add", "团子是一只猫", "--data", str(tmp_path)).code == 0
    for argv in (["history", "s1"], ["sessions"]):
        out = cyrene(capsys, *argv, "--data", str(tmp_path))
        assert out.code == 1
        line = one_line_error(out)
        assert (
            line.startswith(f"cyrene: --data {tmp_path}: no sessions yet")
            and "--checkpoint" not in line
        )
