"""`memory.io.import_jsonl`: check the whole file first, then import in upsert batches."""

from __future__ import annotations

import json

import pytest

from memory import MemoryItem, MemoryStore, Scope
from memory.io import BadLine, ImportReport, MemoryImportError, import_jsonl
from tests.test_memory_scopes import LimitedEmbedding


def line(content: str, **fields) -> str:
    return json.dumps({"content": content, "kind": "fact", "scope": "project", **fields})


@pytest.fixture
def store(tmp_path):
    with MemoryStore.open(tmp_path / "m") as store:
        yield store


def test_every_bad_line_is_reported_and_nothing_is_imported(tmp_path, store):
    lines = [line(f"导入的记忆 {n}") for n in range(1, 1201)]
    lines[2] = '{"content": "缺了右括号"'
    lines[599] = line("   ")
    lines[799] = json.dumps(["not", "an", "object"])
    lines[999] = line("私密", scope="persona")
    lines[1099] = line("x", scope="galaxy")
    raw = "\n".join(lines).encode()
    raw = raw.replace(line("导入的记忆 900").encode(), b'{"content": "\xff\xfe"}')
    path = tmp_path / "bad.jsonl"
    path.write_bytes(raw)
    with pytest.raises(MemoryImportError) as raised:
        import_jsonl(store, path)
    error = raised.value
    assert [bad.number for bad in error.bad_lines] == [3, 600, 800, 900, 1000, 1100]
    reasons = dict((bad.number, bad.reason) for bad in error.bad_lines)
    assert "JSON" in reasons[3] and "content" in reasons[600] and "object" in reasons[800]
    assert "UTF-8" in reasons[900] and "persona_id" in reasons[1000] and "scope" in reasons[1100]
    assert f"{path}:3: " in str(error) and f"{path}:1100: " in str(error)
    assert "6 bad lines" in str(error) and "nothing was imported" in str(error)
    assert isinstance(error, ValueError), "the CLI's boundary handler shows it as a message"
    assert store.list() == []


def test_repeats_collapse_and_the_counts_are_returned(tmp_path, store):
    lines = [line(f"导入的记忆 {n}") for n in range(1200)]
    lines[700] = lines[10]  # a repeat past the first batch
    lines.insert(300, "   ")  # blank lines are skipped, not bad
    lines.append(line("有个孤立代理项\ud800在这里"))
    path = tmp_path / "import.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    progress: list[tuple[int, int]] = []
    report = import_jsonl(
        store, path, batch=500, progress=lambda done, total: progress.append((done, total))
    )
    assert report == ImportReport(
        path=path, lines=1201, unique=1200, stored=1200, repaired=1, failed=()
    )
    assert progress == [(500, 1200), (1000, 1200), (1200, 1200)]
    assert len(store.list()) == 1200
    assert "有个孤立代理项\ufffd在这里" in {i.content for i in store.list()}
    again = import_jsonl(store, path)
    assert (again.stored, len(store.list())) == (1200, 1200), "re-importing upserts"


def test_an_export_imports_back_unchanged(tmp_path, store):
    store.add(
        MemoryItem(content="昔涟的日记", kind="diary", scope=Scope.PERSONA, persona_id="xilian")
    )
    store.add(MemoryItem(content="主人喜欢猫", scope=Scope.USER))
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(i.model_dump_json() for i in store.list()), encoding="utf-8")
    with MemoryStore.open(tmp_path / "other") as other:
        assert import_jsonl(other, path).stored == 2
        assert other.list() == store.list()


def test_a_missing_or_unreadable_file_is_a_clear_error(tmp_path, store):
    with pytest.raises(MemoryImportError, match=r"cannot read .*nope\.jsonl") as raised:
        import_jsonl(store, tmp_path / "nope.jsonl")
    assert isinstance(raised.value.__cause__, FileNotFoundError) and raised.value.bad_lines == ()
    with pytest.raises(MemoryImportError, match="cannot read"):
        import_jsonl(store, tmp_path)


def test_a_failing_write_is_reported_and_the_rest_is_stored(tmp_path):
    path = tmp_path / "import.jsonl"
    path.write_text("\n".join([line("短的"), line("长" * 200), line("也短")]), encoding="utf-8")
    with MemoryStore.open(tmp_path / "m", embedding_function=LimitedEmbedding()) as store:
        report = import_jsonl(store, path)
        assert (report.unique, report.stored) == (3, 2)
        [(item, reason)] = report.failed
        assert item.content == "长" * 200 and "input too long" in reason
        assert sorted(i.content for i in store.list()) == ["也短", "短的"]


def test_bad_line_reads_as_file_colon_line():
    assert str(BadLine(7, "bad JSON")) == "line 7: bad JSON"
