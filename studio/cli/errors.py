"""How `cyrene` fails: exit codes, and one line on stderr for every expected failure.

Imports nothing heavy: `cyrene --help` and every usage error go through here
before the loop is loaded.
"""

from __future__ import annotations

import re

from studio.text import visible

# Exit codes (docs/cli.md).
EXIT_OK = 0
EXIT_NOT_FOUND = 1  # nothing to resume, no such session, memory or data folder
EXIT_USAGE = 2  # bad input or an expected failure: one line on stderr
EXIT_TURN_FAILED = 75  # EX_TEMPFAIL: the turn failed after it started; `cyrene resume` finishes it

_SPACE = re.compile(r"\s+")


class CliError(Exception):
    """An expected failure: one line on stderr and an exit code, never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def one_line(text: str) -> str:
    """`text` folded onto one line: line breaks and tabs become single spaces (a library's
    multi-line message reads as a sentence, never as `\\n\\t`), and what is left that
    could act on the terminal is shown escaped. Never cut: the advice may be at the end."""
    return visible(_SPACE.sub(" ", text).strip())


def brief(text: str, limit: int = 200) -> str:
    """A foreign message (a provider's, a driver's) on one line, cut at a word near
    `limit` characters, for quoting inside our own advice."""
    line = one_line(text)
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " …"


def describe(exc: BaseException) -> str:
    """What went wrong, on one line. A pydantic validation error (a bad field) reads as
    `field: problem` for each error instead of pydantic's multi-line report."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        return "; ".join(_field_error(error) for error in errors())
    return one_line(str(exc))


def _field_error(error: dict) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    return one_line(
        message if message.startswith(f"{where}:") or not where else f"{where}: {message}"
    )
