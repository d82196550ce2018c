"""The README stays true: its commands, its diagram, its configuration table, its quickstart."""

from __future__ import annotations

import re

from graph import LoopConfig, build_graph, open_checkpointer
from studio.demo_model import DemoChatModel
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_first_lines_are_the_two_commands_and_ci_runs_the_second():
    commands = [line.strip() for line in README.splitlines()[:5] if line.startswith("    ")]
    assert len(commands) == 2
    main_job, tests = commands
    assert main_job.endswith("cyrene demo") and "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), ".ci/run runs the README's test command verbatim"


def test_the_diagram_is_generated_from_the_graph():
    block = re.search(r"```mermaid\n(.*?)```", README, re.DOTALL).group(1)
    graph = build_graph(
        LoopConfig(model=DemoChatModel(), vision=lambda b: "", max_context_tokens=8000)
    )
    assert block.strip() == graph.get_graph().draw_mermaid().strip()


def test_every_config_field_is_documented():
    table = {
        row.split("|")[1].strip().strip("`") for row in README.splitlines() if row.startswith("| `")
    }
    assert set(LoopConfig.model_fields) <= table


def test_the_quickstart_runs(tmp_path, monkeypatch):
    code = re.search(r"## Python quickstart\n\n```python\n(.*?)```", README, re.DOTALL).group(1)
    code = code.replace('model="openai:gpt-4o-mini",', "model=DemoChatModel(),")
    monkeypatch.chdir(tmp_path)
    namespace = {"DemoChatModel": DemoChatModel}
    exec(compile(code, "README quickstart", "exec"), namespace)
    with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        graph = build_graph(namespace["config"], saver)
        owner = graph.get_state({"configurable": {"thread_id": "s1"}}).values["messages"]
        group = graph.get_state({"configurable": {"thread_id": "g1"}}).values["messages"]
    assert [m.type for m in owner] == ["human", "ai"] and owner[-1].name == "xilian"
    assert [m.name for m in group] == ["小明", None]


def test_the_configuration_table_says_what_each_field_describes():
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| .*? \| (.*) \|$", README, re.MULTILINE)
    }
    for name, field in LoopConfig.model_fields.items():
        assert rows.get(name) == field.description, (
            f"README's row for `{name}` differs from LoopConfig.{name}'s Field(description=…)"
        )
