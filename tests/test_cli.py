"""The `cyrene` console script, run as a user would: a real subprocess on a data folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def cyrene(*args: str, data: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CYRENE_MODEL", None)
    return subprocess.run(
        [sys.executable, "-m", "studio.cli", *args, "--data", str(data)],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


pytestmark = pytest.mark.slow


def test_run_twice_on_one_session_sees_the_first_turn(tmp_path):
    first = cyrene("run", "你好", "--session", "s1", data=tmp_path)
    second = cyrene("run", "今天天气不错", "--session", "s1", data=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "演示模型" in first.stderr, "the demo model says it is a demo"
    assert "这是我们这次对话的第一句" in first.stdout
    assert "你上一句说的是「你好」" in second.stdout
    history = cyrene("history", "s1", data=tmp_path)
    lines = [line.split(maxsplit=1) for line in history.stdout.splitlines()]
    assert [who for who, _ in lines] == ["human", "ai(xilian)", "human", "ai(xilian)"]
    assert (tmp_path / "checkpoints.db").exists() and (tmp_path / "memory").is_dir()


def test_persona_and_group_options(tmp_path):
    out = cyrene("run", "你好", "--persona", "aglaea", "--session", "p", data=tmp_path)
    assert "阿格莱雅" in out.stdout
    group = cyrene(
        "run",
        "用 take_note 记一下",
        "--actor",
        "group",
        "--name",
        "小明",
        "--session",
        "g",
        data=tmp_path,
    )
    assert "not_allowed" in group.stdout
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(a["tool"], a["actor"], a["session_id"]) for a in audit] == [
        ("take_note", "group", "g")
    ]


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    out = cyrene("resume", "nobody", data=tmp_path)
    assert out.returncode == 1
    assert "has no interrupted turn" in out.stderr


def test_chat_reads_commands_from_stdin(tmp_path):
    out = cyrene(
        "chat", "--session", "c", data=tmp_path, stdin="你好\n/persona aglaea\n你是谁\n/quit\n"
    )
    assert out.returncode == 0, out.stderr
    assert "昔涟：收到「你好」" in out.stdout and "阿格莱雅：收到「你是谁」" in out.stdout


def test_memory_commands(tmp_path):
    jsonl = tmp_path / "import.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(
                {"content": f"导入的记忆 {i}", "kind": "fact", "scope": "project"},
                ensure_ascii=False,
            )
            for i in range(1200)
        )
    )
    imported = cyrene("memory", "import", str(jsonl), data=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "imported 1200 memories" in imported.stdout and "1200/1200" in imported.stderr
    added = cyrene(
        "memory", "add", "主人养了一只猫叫团子", "--kind", "fact", "--scope", "user", data=tmp_path
    )
    item_id = added.stdout.strip()
    assert "团子" in cyrene("memory", "search", "猫 团子", data=tmp_path).stdout
    assert cyrene("memory", "forget", item_id, data=tmp_path).returncode == 0
    assert "团子" not in cyrene("memory", "search", "猫 团子", data=tmp_path).stdout
    exported = cyrene("memory", "export", data=tmp_path).stdout.splitlines()
    assert len(exported) == 1200
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "", "scope": "user"}\n')
    failed = cyrene("memory", "import", str(bad), data=tmp_path)
    assert failed.returncode == 1 and "bad.jsonl:1" in failed.stderr and "content" in failed.stderr


def test_demo_runs_offline_and_persists(tmp_path):
    out = cyrene("demo", data=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "「查到了」是「昔涟」（xilian）说的" in out.stdout
    assert "「大家好」是「小明」说的" in out.stdout
    assert "not_allowed" in out.stdout
    assert "昔涟可见：我周末想去爬山" in out.stdout
    assert "群聊可见：我周末想去爬山" not in out.stdout


def test_bad_input_is_a_message_not_a_traceback(tmp_path):
    bad_model = cyrene("run", "hi", "--model", "nosuchprovider:x", data=tmp_path)
    assert bad_model.returncode == 2
    assert "cyrene: --model: cannot load chat model 'nosuchprovider:x'" in bad_model.stderr
    assert "Traceback" not in bad_model.stderr
    orphan = cyrene("memory", "add", "私密", "--scope", "persona", data=tmp_path)
    assert (
        orphan.returncode == 2
        and "persona_id" in orphan.stderr
        and "Traceback" not in orphan.stderr
    )
