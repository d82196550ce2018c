"""What to run to install one of the package's extras, for a clone or an installed package.

An error that names a missing extra must give a command that works where the
user is: in a clone (an editable install, with pyproject.toml beside the
packages) that is `pip install -e '<clone>[extra]'`; for a package installed
from an index or a wheel, `pip install 'cyrene-graph[extra]'`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

PACKAGE = "cyrene-graph"
_CLONE = Path(__file__).resolve().parents[2]  # nodes/kernel/extras.py → the clone


def install_command(extra: str) -> str:
    """The pip command that installs `extra` into the running interpreter's environment."""
    pip = f"{_shown(Path(sys.executable))} -m pip install"
    if (_CLONE / "pyproject.toml").exists():
        return f"{pip} -e {shlex.quote(f'{_shown(_CLONE)}[{extra}]')}"
    return f"{pip} {shlex.quote(f'{PACKAGE}[{extra}]')}"


def _shown(path: Path) -> str:
    """`path` relative to the current folder when it is inside it (shorter to paste)."""
    try:
        relative = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(relative) if str(relative) != "." else "."


def missing_extra(extra: str, what: str) -> str:
    """A one-line message: `what` needs `extra`, and the command that installs it."""
    return f"{what} needs the {extra} extra: {install_command(extra)}"
