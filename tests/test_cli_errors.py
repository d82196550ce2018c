"""Every expected failure of `cyrene` is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import socket
import sqlite3
import stat
import time
from pathlib import Path

import pytest

import studio.cli.storage
from tests.cli_support import cyrene, cyrene_process, one_line_error, unprivileged
from tests.conftest import free_port


def test_a_data_folder_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for argv in (["run", "hi"], ["history", "s1"], ["memory", "list"], ["chat"]):
        out = cyrene(capsys, "--data", str(afile), *argv)
        assert out.code == 2, argv
        assert one_line_error(out) == f"cyrene: --data {afile}: not a folder"


def test_a_data_folder_that_cannot_be_created(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    out = cyrene(capsys, "run", "hi", "--data", str(tmp_path / "afile" / "data"))
    assert out.code == 2
    assert "cannot write there (Not a directory)" in one_line_error(out)


def test_a_sqlite_checkpoint_that_is_a_folder_or_not_a_database(tmp_path, capsys):
    folder = tmp_path / "db"
    folder.mkdir()
    junk = tmp_path / "junk.db"
    junk.write_text("hello, not sqlite\n" * 100)
    data = ("--data", str(tmp_path / "data"))
    for command in (["run", "hi"], ["history", "s1"]):
        as_folder = cyrene(capsys, *command, "--checkpoint", f"sqlite:///{folder}", *data)
        assert as_folder.code == 2
        assert f"{folder} is a folder, not a SQLite database" in one_line_error(as_folder)
        not_db = cyrene(capsys, *command, "--checkpoint", f"sqlite:///{junk}", *data)
        assert not_db.code == 2
        assert "file is not a database" in one_line_error(not_db)


def test_an_unreachable_postgres_fails_fast(tmp_path, capsys, monkeypatch):
    pytest.importorskip("psycopg")
    data = ("--data", str(tmp_path))
    refused = cyrene(
        capsys,
        "run",
        "hi",
        "--checkpoint",
        f"postgresql://postgres@127.0.0.1:{free_port()}/x",
        *data,
    )
    assert refused.code == 2 and "Connection refused" in one_line_error(refused)
    # A server that accepts the connection and never answers: only a connect timeout ends it.
    monkeypatch.setattr(studio.cli.storage, "POSTGRES_CONNECT_TIMEOUT", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        hung = cyrene(
            capsys,
            "history",
            "s",
            "--checkpoint",
            f"postgresql://postgres@127.0.0.1:{port}/x",
            *data,
        )
        took = time.monotonic() - started
    assert hung.code == 2 and f"127.0.0.1:{port}" in one_line_error(hung)
    assert took < 10, f"gave up after {took:.1f}s"


def test_a_missing_import_file(tmp_path, capsys):
    out = cyrene(capsys, "memory", "import", str(tmp_path / "nope.jsonl"), "--data", str(tmp_path))
    assert out.code == 2
    assert "cannot read" in one_line_error(out) and "nope.jsonl" in out.err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "   "], "no text"),
        (["run", "hi", "--session", "a\x00b"], "NUL"),
        (["history", "a\x00b"], "NUL"),
        (["run", "hi", "--actor", "group", "--name", "小明", "--session", "a\udc80"], "surrogate"),
    ],
)
def test_input_the_loop_refuses(tmp_path, capsys, argv, says):
    out = cyrene(capsys, *argv, "--data", str(tmp_path))
    assert out.code == 2
    assert says in one_line_error(out)
    assert "\x00" not in out.err, "shown escaped"


def test_a_read_only_data_folder(tmp_path, capsys):
    """`history` reads a read-only folder (it opens only the checkpoints, read-only); the
    commands that write say the folder is read-only."""
    data, prefix = tmp_path / "data", unprivileged()
    first = cyrene(capsys, "run", "你好", "--session", "s1", "--data", str(data))
    assert first.code == 0, first.err
    for path in [data, *data.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        history = cyrene_process("history", "s1", "--data", str(data), prefix=prefix)
        assert history.returncode == 0, history.stderr
        assert [line.split()[0] for line in history.stdout.splitlines()] == ["human", "ai(xilian)"]
        assert history.stderr == "", "no demo model, no memory store"
        run = cyrene_process("run", "再来", "--session", "s1", "--data", str(data), prefix=prefix)
        assert run.returncode == 2
        assert f"--data {data}: cannot write there" in one_line_error(run)
    finally:
        for path in [data, *data.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert _checkpoint_rows(data / "checkpoints.db") > 0, "the database is intact"


def _checkpoint_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
