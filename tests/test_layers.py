"""The floors point one way and every module stands on its own.

`studio` → `graph` → `nodes.loop` → the feature folders → `nodes.core` →
`memory` → `nodes.kernel`: a module imports only from its own floor or below.
import-linter states the contract (`pyproject.toml`); this test runs it, and
imports every module alone in a fresh interpreter, which is how a user
importing one module meets a circular import.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("memory", "nodes", "graph", "studio")


def all_modules() -> list[str]:
    modules = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_every_package_is_covered():
    assert {m.split(".")[0] for m in all_modules()} == set(PACKAGES)


def test_every_folder_of_code_is_a_package():
    """A folder without `__init__.py` is a namespace package that `packages.find` leaves
    out of the wheel."""
    folders = {path.parent for package in PACKAGES for path in (REPO / package).rglob("*.py")}
    assert (
        sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()) == []
    )


# Imports each of our modules in a forked child of one interpreter that has
# loaded only third-party libraries: none of our modules is in the parent's
# `sys.modules`, so each child meets our import graph exactly as a fresh
# interpreter does, without paying ~1 s of LangChain imports per module.
FORK_EACH = """
import os, sys, traceback
import chromadb, langchain, langchain_core.messages, langgraph.graph, pydantic
assert not {m.split('.')[0] for m in sys.modules} & {'memory', 'nodes', 'graph', 'studio'}
failed = []
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(module)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(module)
print('FAILED:', ' '.join(failed))
"""


def test_every_module_imports_alone():
    done = subprocess.run(
        [sys.executable, "-c", FORK_EACH, *all_modules()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "FAILED:", (
        f"these modules fail alone:\n{done.stdout}{done.stderr[-3000:]}"
    )


def imports_of(module: str, known: set[str]) -> set[str]:
    """The project modules `module` imports, type-checking-only imports included: an
    annotation-only cycle still makes two modules impossible to read one without the other."""
    path = REPO.joinpath(*module.split("."))
    source = (path / "__init__.py") if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    # A package's own submodules may import it (its __init__ re-exports them).
    return {m for m in found & known if m != module and not module.startswith(m + ".")}


def test_no_module_import_cycle():
    """Across packages too: `memory` stands on `nodes.kernel`, which imports nothing above it."""
    known = set(all_modules())
    graph = {m: imports_of(m, known) for m in known}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as cycle:
        raise AssertionError(f"import cycle: {' -> '.join(cycle.args[1])}") from None


def test_every_subpackage_is_on_a_floor():
    """A package the contract does not name is bound by nothing."""
    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    named = {
        name.strip()
        for floor in contract["contracts"][0]["layers"]
        for name in floor.replace(":", "|").split("|")
    }
    packages = {
        ".".join(path.parent.relative_to(REPO).parts)
        for path in (REPO / "nodes").glob("*/__init__.py")
    } | {
        ".".join(path.parent.relative_to(REPO).parts)
        for path in (REPO / "memory").glob("*/__init__.py")
    }
    assert sorted(packages - named) == []


def test_the_layer_contract_holds():
    binary = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    done = subprocess.run([binary], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"an import points upward:\n{done.stdout[-3000:]}"
    assert "1 kept, 0 broken" in done.stdout
