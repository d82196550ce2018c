"""The README stays true: its commands, its snippets (run verbatim), its diagram, its tables."""

from __future__ import annotations

import re
import tomllib

import pytest

from graph import LoopConfig, open_checkpointer
from studio import settings
from studio.cli import main as cli
from studio.cli.read import loop_drawing
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def python_block(after: str) -> str:
    """The first ```python block after the line `after`."""
    start = README.index(after)
    return re.search(r"```python\n(.*?)```", README[start:], re.DOTALL).group(1)


def test_the_first_screen_says_what_this_is_then_gives_the_two_commands():
    first_screen = README.splitlines()[:12]
    commands = [line.strip() for line in first_screen if line.startswith("    ")]
    assert len(commands) == 2
    main_job, tests = commands
    assert main_job.endswith("cyrene demo") and "pytest" in tests
    before = " ".join(first_screen[: first_screen.index(f"    {main_job}")])
    assert "agent loop of an AI companion" in before and "LangGraph" in before
    ci = (REPO / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), ".ci/run runs the README's test command verbatim"


# What the repository was specified from is not in it: no text may send a reader there.
OUTSIDE = re.compile(r"\.\./shared|DESIGN(\.md| §)|\bseeds?\b ?`|the seed's| \(seed\)|seed layout")


def shipped_texts() -> list:
    """The code, the docs and the tests (but this test's own pattern)."""
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for package in ("graph", "nodes", "memory", "studio", "tests"):
        found += sorted((REPO / package).rglob("*.py")) + sorted((REPO / package).rglob("*.md"))
    return [path for path in found if path != REPO / "tests" / "test_readme.py"]


def test_nothing_points_outside_the_repository():
    assert "../" not in README
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if not link.startswith("http"):
            assert (REPO / link).exists(), link
    pointing = [
        f"{path.relative_to(REPO)}:{number}"
        for path in shipped_texts()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert pointing == [], "these lines point at documents outside the repository"


def test_the_diagram_is_what_cyrene_graph_prints():
    block = re.search(r"```mermaid\n(.*?)```", README, re.DOTALL).group(1)
    assert block.strip() == loop_drawing()


def test_every_config_field_is_documented():
    table = {
        row.split("|")[1].strip().strip("`") for row in README.splitlines() if row.startswith("| `")
    }
    assert set(LoopConfig.model_fields) <= table


@pytest.fixture
def quickstart(tmp_path, monkeypatch, capsys) -> dict:
    """The quickstart run verbatim in a fresh folder; its names, for the snippets after it."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(python_block("## Python quickstart"), "README quickstart", "exec"), namespace)
    namespace["printed"] = capsys.readouterr().out.splitlines()
    return namespace


def test_the_quickstart_runs_verbatim_and_prints_the_replies(quickstart):
    assert quickstart["printed"] == [
        "（演示模型）昔涟：收到「早安」。这是我们这次对话的第一句。",
        "（演示模型）昔涟：收到「大家好」。这是我们这次对话的第一句。",
    ]
    with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        from graph import build_graph

        graph = build_graph(quickstart["config"], saver)
        owner = graph.get_state({"configurable": {"thread_id": "s1"}}).values["messages"]
        group = graph.get_state({"configurable": {"thread_id": "g1"}}).values["messages"]
    assert [m.type for m in owner] == ["human", "ai"] and owner[-1].name == "xilian"
    assert [m.name for m in group] == ["小明", None]


def test_the_imported_history_snippet_runs(quickstart, capsys):
    code = python_block("### Trusted system and assistant text, and imported history")
    exec(compile(code, "README Trusted", "exec"), {"config": quickstart["config"]})
    assert capsys.readouterr().out.splitlines()[-1] == "7"


def test_the_worker_shutdown_snippet_runs(quickstart, capsys):
    code = python_block("A worker process of your own gets the same shutdown")
    with pytest.raises(SystemExit) as stopped:
        exec(compile(code, "README shutdown", "exec"), {"config": quickstart["config"]})
    assert stopped.value.code == 0


def test_the_configuration_table_says_what_each_field_describes():
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| .*? \| (.*) \|$", README, re.MULTILINE)
    }
    for name, field in LoopConfig.model_fields.items():
        assert rows.get(name) == field.description, (
            f"README's row for `{name}` differs from LoopConfig.{name}'s Field(description=…)"
        )
        assert "seed `" not in field.description, "say what the knob does"


def test_every_environment_variable_and_extra_is_in_its_table():
    section = README[README.index("## Environment variables") : README.index("## Checkpoint URLs")]
    names = {v for k, v in vars(settings).items() if k.endswith("_ENV")}
    assert names == set(cli.ENV.values())
    for name in names | {"OTEL_EXPORTER_OTLP_ENDPOINT", "LANGSMITH_TRACING"}:
        assert f"| `{name}`" in section or f"`{name}`," in section, name
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    section = README[README.index("## Extras") : README.index("## Environment variables")]
    for extra in extras:
        assert f"| `{extra}` |" in section and f"'.[{extra}]'" in section, extra


def test_the_benchmark_table_keeps_its_markers_and_format():
    table = README[README.index("<!-- bench:start -->") : README.index("<!-- bench:end -->")]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| benchmark | ours | peer | ratio | target |"
    assert all(row.count(" | ") == 4 for row in rows[2:]), "five columns"
    assert any(row.startswith("| `cyrene --help`") for row in rows)
