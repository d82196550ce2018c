"""The README and docs/ stay true: commands, snippets (run verbatim), diagram, tables, links.

Each check reads the page its section is on: the README keeps the first screen, the quickstart,
the graph and the map; the other topics are pages of docs/, all linked from the README.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from graph import Feature, LoopConfig, open_checkpointer
from studio import settings
from studio.cli import main as cli
from studio.cli.read import loop_drawing
from tests import config_tables
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = sorted((REPO / "docs").glob("*.md"))


def page(name: str) -> str:
    """The text of the docs page `name` (e.g. "memory.md")."""
    return (REPO / "docs" / name).read_text(encoding="utf-8")


def python_block(text: str, after: str) -> str:
    """The first ```python block of `text` after the line `after`."""
    start = text.index(after)
    return re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)


def section(text: str, heading: str) -> str:
    """The section of `text` from the line `heading` to the next heading of its level or above."""
    start = text.index(f"{heading}\n")
    level = len(heading) - len(heading.lstrip("#"))
    following = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, start + len(heading))
    return text[start : following.start() if following else len(text)]


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


def markdown_pages() -> list[Path]:
    """The README, the docs pages and every other Markdown file shipped with the code."""
    return [path for path in shipped_texts() if path.suffix == ".md"]


def relative_links(path: Path) -> list[tuple[Path, str]]:
    """The (target file, anchor) of each link in the Markdown file `path` that is not a URL."""
    found = re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8"))
    return [
        ((path.parent / target).resolve() if target else path, anchor)
        for target, _, anchor in (link.partition("#") for link in found)
        if not re.match(r"\w+:", target)
    ]


def headings(path: Path) -> dict[str, str]:
    """Heading text → its GitHub anchor, for the headings of `path` outside fenced code."""
    found, fenced = {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.lstrip().startswith("```")
        if not fenced and (heading := re.match(r"#+ (.*)", line)):
            text = heading.group(1)
            found[text] = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    return found


def test_nothing_points_outside_the_repository():
    assert "../" not in README
    for path in markdown_pages():
        for target, _ in relative_links(path):
            assert target.is_relative_to(REPO), f"{path.relative_to(REPO)} links to {target}"
    pointing = [
        f"{path.relative_to(REPO)}:{number}"
        for path in shipped_texts()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert pointing == [], "these lines point at documents outside the repository"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {target for target, _ in relative_links(REPO / "README.md")}
    unlinked = [path.name for path in DOCS if path not in linked]
    assert DOCS and unlinked == [], "docs pages the README does not link to"


def test_every_relative_link_resolves():
    for path in markdown_pages():
        for target, anchor in relative_links(path):
            where = f"{path.relative_to(REPO)} links to {target}#{anchor}"
            assert target.exists(), where
            if anchor:
                assert anchor in headings(target).values(), where


def test_every_page_the_code_names_has_the_section_it_names():
    """`docs/memory.md "Lifecycle: …"` (or `README "The graph"`) in any shipped text: that
    page, with a heading of that text."""
    for path in shipped_texts():
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"\bdocs/[\w-]+\.md", text):
            assert (REPO / name).exists(), f"{path.relative_to(REPO)} names {name}"
        for name, heading in re.findall(r'\b(docs/[\w-]+\.md|README)\s+"([^"\n]+)"', text):
            target = REPO / (name if name.startswith("docs/") else "README.md")
            assert heading in headings(target), f"{path.relative_to(REPO)}: {name} {heading}"


def test_the_diagram_is_what_cyrene_graph_prints():
    block = re.search(r"```mermaid\n(.*?)```", README, re.DOTALL).group(1)
    assert block.strip() == loop_drawing()


def test_every_config_field_is_documented():
    configuration = page("configuration.md")
    assert config_tables.table(LoopConfig) in configuration
    for kind, folder in config_tables.FEATURES:
        assert f"{config_tables.feature_heading(kind, folder)}\n\n{config_tables.table(kind)}" in (
            configuration
        ), f"docs/configuration.md's section for {kind.__name__} (python -m tests.config_tables)"
    assert config_tables.moved_table() in configuration


@pytest.fixture
def quickstart(tmp_path, monkeypatch, capsys) -> dict:
    """The quickstart run verbatim in a fresh folder; its names, for the snippets after it."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    code = python_block(README, "## Python quickstart")
    exec(compile(code, "README quickstart", "exec"), namespace)
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


def test_the_quickstart_run_again_answers_its_message_once(quickstart, capsys):
    """Issue 32 finding 10: a second run of the quickstart (its fixed `id="m1"`) left two
    replies to one message; now m1 gets the reply it has, and nothing is stored for it."""
    exec(compile(python_block(README, "## Python quickstart"), "again", "exec"), {})
    again = capsys.readouterr().out.splitlines()
    assert again[0] == quickstart["printed"][0], "the reply m1 already had"
    with open_checkpointer("sqlite:///.cyrene/checkpoints.db") as saver:
        from graph import build_graph

        graph = build_graph(quickstart["config"], saver)
        owner = graph.get_state({"configurable": {"thread_id": "s1"}}).values["messages"]
        group = graph.get_state({"configurable": {"thread_id": "g1"}}).values["messages"]
    assert [m.type for m in owner] == ["human", "ai"], "m1 answered once"
    assert [m.type for m in group] == ["human", "ai"] * 2, "no id: a new message each run"


def test_the_imported_history_snippet_runs(quickstart, capsys):
    code = python_block(
        page("what-a-run-accepts.md"), "## Trusted system and assistant text, and imported history"
    )
    exec(
        compile(code, "docs/what-a-run-accepts.md Trusted", "exec"),
        {"config": quickstart["config"]},
    )
    assert capsys.readouterr().out.splitlines()[-1] == "7"


def test_the_worker_shutdown_snippet_runs(quickstart, capsys):
    code = python_block(page("cli.md"), "A worker process of your own gets the same shutdown")
    with pytest.raises(SystemExit) as stopped:
        exec(compile(code, "docs/cli.md shutdown", "exec"), {"config": quickstart["config"]})
    assert stopped.value.code == 0


def all_subclasses(kind: type) -> list[type]:
    return [sub for direct in kind.__subclasses__() for sub in (direct, *all_subclasses(direct))]


def test_every_feature_has_its_section_and_says_what_each_field_does():
    documented = {kind for kind, _ in config_tables.FEATURES}
    assert documented == set(all_subclasses(Feature)), "a feature without its section"
    for model in (LoopConfig, *documented):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            assert "seed `" not in field.description, "say what the knob does"


def test_every_environment_variable_and_extra_is_in_its_table():
    variables = section(page("extras-and-environment.md"), "## Environment variables")
    names = {v for k, v in vars(settings).items() if k.endswith("_ENV")}
    assert names == set(cli.ENV.values())
    for name in names | {"OTEL_EXPORTER_OTLP_ENDPOINT", "LANGSMITH_TRACING"}:
        assert f"| `{name}`" in variables or f"`{name}`," in variables, name
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installs = section(page("extras-and-environment.md"), "## Extras")
    for extra in extras:
        assert f"| `{extra}` |" in installs and f"'.[{extra}]'" in installs, extra


def test_the_benchmark_table_keeps_its_markers_and_format():
    benchmarks = page("benchmarks.md")
    table = benchmarks[
        benchmarks.index("<!-- bench:start -->") : benchmarks.index("<!-- bench:end -->")
    ]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| benchmark | ours | peer | ratio | target |"
    assert all(row.count(" | ") == 4 for row in rows[2:]), "five columns"
    assert any(row.startswith("| `cyrene --help`") for row in rows)
