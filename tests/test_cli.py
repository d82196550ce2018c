"""The `cyrene` console script: the installed script and the demo as real subprocesses,
the rest in-process (`main([...])`), on a real data folder."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from studio.cli.main import parser
from tests.cli_support import chat, cyrene, cyrene_process, one_line_error
from tests.conftest import REPO


def test_the_installed_script_runs_turns_that_persist(tmp_path):
    script = Path(sys.executable).with_name("cyrene")
    env = {k: v for k, v in os.environ.items() if k != "CYRENE_MODEL"}
    first = subprocess.run(
        [str(script), "--data", str(tmp_path), "--session", "s1", "run", "你好"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    assert "演示模型" in first.stderr, "the demo model says it is a demo"
    assert "这是我们这次对话的第一句" in first.stdout
    assert (tmp_path / "checkpoints.db").exists() and (tmp_path / "memory").is_dir()


def test_run_twice_on_one_session_sees_the_first_turn(tmp_path, capsys):
    first = cyrene(capsys, "run", "你好", "--session", "s1", "--data", str(tmp_path))
    second = cyrene(capsys, "--data", str(tmp_path), "--session", "s1", "run", "今天天气不错")
    assert (first.code, second.code) == (0, 0), first.err + second.err
    assert "这是我们这次对话的第一句" in first.out
    assert "你上一句说的是「你好」" in second.out
    history = cyrene(capsys, "history", "s1", "--data", str(tmp_path))
    lines = [line.split(maxsplit=1) for line in history.out.splitlines()]
    assert [who for who, _ in lines] == ["human", "ai(xilian)", "human", "ai(xilian)"]


AS_XIAOMING = ["--session", "s", "--persona", "aglaea", "--actor", "group", "--name", "小明"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--data", "D", *AS_XIAOMING, "run", "hi"],
        ["run", "hi", "--data", "D", *AS_XIAOMING],
        ["--data", "X", "--session", "t", "run", "hi", "--data", "D", *AS_XIAOMING],
        [
            "--data",
            "D",
            "--actor",
            "group",
            "run",
            "--session",
            "s",
            "hi",
            "--persona",
            "aglaea",
            "--name",
            "小明",
        ],
    ],
)
def test_global_options_go_before_or_after_the_command(argv):
    args = parser().parse_args(argv)
    assert (args.data, args.session, args.persona, args.actor, args.name, args.text) == (
        Path("D"),
        "s",
        "aglaea",
        "group",
        "小明",
        "hi",
    )


def test_options_before_nested_commands_are_kept():
    for argv in (
        ["--data", "D", "--persona", "p", "memory", "list"],
        ["memory", "--data", "D", "--persona", "p", "list"],
        ["memory", "list", "--data", "D", "--persona", "p"],
    ):
        args = parser().parse_args(argv)
        assert (args.data, args.persona, args.action) == (Path("D"), "p", "list")
    assert parser().parse_args(["history", "s"]).data == Path(".cyrene"), "the default stays"
    args = parser().parse_args(["--checkpoint", "memory", "history", "s"])
    assert args.checkpoint == "memory" and args.session_id == "s"


def test_persona_and_group_options(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    out = cyrene(capsys, "--persona", "aglaea", "run", "你好", "--session", "p", *data)
    assert "阿格莱雅" in out.out
    group = cyrene(
        capsys,
        *data,
        "--actor",
        "group",
        "--name",
        "小明",
        "run",
        "用 take_note 记一下",
        "--session",
        "g",
    )
    assert "not_allowed" in group.out
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(a["tool"], a["actor"], a["session_id"]) for a in audit] == [
        ("take_note", "group", "g")
    ]


def test_resume_with_nothing_to_resume_says_so(tmp_path, capsys):
    out = cyrene(capsys, "resume", "nobody", "--data", str(tmp_path))
    assert out.code == 1
    assert "has no interrupted turn" in one_line_error(out)


def test_chat_reads_commands_from_stdin(tmp_path, capsys):
    out = chat(capsys, tmp_path, "c", "你好\n/persona aglaea\n你是谁\n/quit\n")
    assert out.code == 0, out.err
    assert "昔涟：收到「你好」" in out.out and "阿格莱雅：收到「你是谁」" in out.out


def test_memory_commands(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    jsonl = tmp_path / "import.jsonl"
    rows = [{"content": f"导入的记忆 {i}", "kind": "fact", "scope": "project"} for i in range(1200)]
    rows[900] = rows[5]  # a repeat past the first batch collapses
    jsonl.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in rows))
    imported = cyrene(capsys, "memory", "import", str(jsonl), *data)
    assert imported.code == 0, imported.err
    assert "imported 1199 memories from 1200 lines (1 repeats collapsed" in imported.out
    assert "1199/1199" in imported.err
    added = cyrene(
        capsys, "memory", "add", "主人养了一只猫叫团子", "--kind", "fact", "--scope", "user", *data
    )
    item_id = added.out.strip()
    assert "团子" in cyrene(capsys, "memory", "search", "猫 团子", *data).out
    forgot = cyrene(capsys, "memory", "forget", item_id, *data)
    assert forgot.code == 0 and forgot.out == f"forgot {item_id} and the memories it replaced\n"
    assert cyrene(capsys, "memory", "forget", item_id, *data).code == 1, "not found"
    assert "团子" not in cyrene(capsys, "memory", "search", "猫 团子", *data).out
    exported = cyrene(capsys, "--data", str(tmp_path), "memory", "export").out.splitlines()
    assert len(exported) == 1199


def test_memory_import_reports_every_bad_line_and_imports_nothing(tmp_path, capsys):
    rows = [json.dumps({"content": f"记忆 {i}", "scope": "user"}) for i in range(700)]
    rows[0] = '{"content": "", "scope": "user"}'
    rows[599] = rows[3]  # a repeat is not an error
    rows[649] = '{"content": "缺了右括号"'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(rows))
    failed = cyrene(capsys, "memory", "import", str(bad), "--data", str(tmp_path))
    assert failed.code == 2 and "Traceback" not in failed.err
    assert f"{bad}:1: " in failed.err and "content" in failed.err
    assert f"{bad}:650: " in failed.err and "JSON" in failed.err
    assert "2 bad lines" in failed.err and f"{bad}:600" not in failed.err
    assert cyrene(capsys, "memory", "list", "--data", str(tmp_path)).out == ""


def test_demo_runs_offline_and_persists(tmp_path):
    out = cyrene_process("demo", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "「查到了」是「昔涟」（xilian）说的" in out.stdout
    assert "「大家好」是「小明」说的" in out.stdout
    assert "not_allowed" in out.stdout
    assert "昔涟可见：我周末想去爬山" in out.stdout
    assert "群聊可见：我周末想去爬山" not in out.stdout


def test_bad_input_is_a_message_not_a_traceback(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    bad_model = cyrene(capsys, "run", "hi", "--model", "nosuchprovider:x", *data)
    assert bad_model.code == 2
    assert "cyrene: --model: cannot load chat model 'nosuchprovider:x'" in one_line_error(bad_model)
    orphan = cyrene(capsys, "memory", "add", "私密", "--scope", "persona", *data)
    assert orphan.code == 2 and "persona_id" in one_line_error(orphan)


def test_prune_keeps_the_transcript_and_the_next_turn(tmp_path, capsys):
    data = ("--data", str(tmp_path))
    for text in ("第一句", "第二句", "第三句"):
        assert cyrene(capsys, "run", text, "--session", "s1", *data).code == 0
    before = cyrene(capsys, "history", "s1", *data).out
    db = tmp_path / "checkpoints.db"
    rows_before = _checkpoint_rows(db)
    pruned = cyrene(capsys, "prune", "--keep", "2", *data)
    assert pruned.code == 0, pruned.err
    assert pruned.out.startswith("pruned 1 session(s): deleted ")
    assert _checkpoint_rows(db) == 2 < rows_before
    assert cyrene(capsys, "history", "s1", *data).out == before, "the transcript is whole"
    after = cyrene(capsys, "run", "第四句", "--session", "s1", *data)
    assert "你上一句说的是「第三句」" in after.out
    for argv in (["--keep", "0"], ["--checkpoint", "memory"]):
        refused = cyrene(capsys, "prune", *argv, *data)
        assert refused.code == 2
        one_line_error(refused)


def _checkpoint_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
