"""Importing memories from JSON lines: check the whole file, then write in upsert batches.

    from memory.io import MemoryImportError, import_jsonl

    try:
        report = import_jsonl(store, "memories.jsonl", progress=lambda done, total: ...)
    except MemoryImportError as error:   # nothing was written
        for bad in error.bad_lines: print(f"{error.path}:{bad.number}: {bad.reason}")
    print(f"{report.stored} of {report.unique} stored ({report.lines} lines)")

A file either imports as a whole or not at all: every line is read and
validated first, and if any is bad the error lists them all (number and
reason) and the store is untouched. One line is one `MemoryItem` as JSON (the
format `cyrene memory export` writes); blank lines are skipped. Lines that
describe the same memory (same id) collapse into one, the last winning. Lone
surrogates from `\\ud800`-style escapes follow the item policy (U+FFFD) and
are counted in `ImportReport.repaired`.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memory.errors import MemoryStoreError, MemoryWriteError
from memory.items import MemoryItem, require_owner
from memory.protocols import MemoryBackend
from nodes.kernel.text import clean_text

DEFAULT_BATCH = 500

Progress = Callable[[int, int], None]
"""Called after each batch with (items written so far, items to write)."""


@dataclass(frozen=True)
class BadLine:
    """One line that cannot become a memory: its 1-based number and why."""

    number: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.number}: {self.reason}"


class MemoryImportError(MemoryStoreError, ValueError):
    """The file cannot be imported, and nothing was.

    Attributes:
        path: the file.
        bad_lines: every bad line, in file order (empty when the file itself cannot be read).
    """

    def __init__(self, path: Path, bad_lines: tuple[BadLine, ...] = (), reason: str = "") -> None:
        self.path = path
        self.bad_lines = bad_lines
        if not reason:
            count = f"{len(bad_lines)} bad line{'s' if len(bad_lines) != 1 else ''}"
            listed = "".join(f"\n{path}:{bad.number}: {bad.reason}" for bad in bad_lines)
            reason = f"{path}: {count}, nothing was imported:{listed}"
        super().__init__(reason)


@dataclass(frozen=True)
class ImportReport:
    """What an import did.

    Attributes:
        path: the file.
        lines: non-blank lines read.
        unique: distinct memories among them (repeats collapse by id).
        stored: memories written.
        repaired: lines whose lone surrogates became U+FFFD.
        failed: (item, reason) for each memory the store refused; the others were stored.
    """

    path: Path
    lines: int
    unique: int
    stored: int
    repaired: int = 0
    failed: tuple[tuple[MemoryItem, str], ...] = ()


@dataclass(frozen=True)
class _Checked:
    """A file that passed the check: its unique items, non-blank lines and repaired lines."""

    items: list[MemoryItem]
    lines: int
    repaired: int


def _check_file(path: Path) -> _Checked:
    """Every line of the file as a memory, or the error listing every bad line.

    Raises:
        MemoryImportError: the file cannot be read, or has bad lines.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MemoryImportError(path, reason=f"cannot read {path}: {exc.strerror}") from exc
    items: dict[str, MemoryItem] = {}
    bad: list[BadLine] = []
    lines = repaired = 0
    for number, data in enumerate(raw.removeprefix(codecs.BOM_UTF8).split(b"\n"), 1):
        if not data.strip():
            continue
        lines += 1
        try:
            item, had_surrogates = _parse(data)
        except ValueError as exc:
            bad.append(BadLine(number, str(exc)))
            continue
        items[item.id or ""] = item  # the last copy of a repeat wins
        repaired += had_surrogates
    if bad:
        raise MemoryImportError(path, tuple(bad))
    return _Checked(list(items.values()), lines, repaired)


def _parse(data: bytes) -> tuple[MemoryItem, bool]:
    """One line → (item, whether it held lone surrogates). ValueError says what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        record: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    try:
        item = MemoryItem.model_validate(record)
    except ValidationError as exc:
        raise ValueError("; ".join(_describe(error) for error in exc.errors())) from None
    require_owner(item)
    dumped = json.dumps(record, ensure_ascii=False)
    return item, clean_text(dumped) != dumped


def _describe(error: Mapping[str, Any]) -> str:
    """`field: what is wrong`, once (our validators already name the field)."""
    where = ".".join(str(part) for part in error["loc"]) or "item"
    message = str(error["msg"]).removeprefix("Value error, ")
    return message if message.startswith(f"{where}:") else f"{where}: {message}"


def import_jsonl(
    store: MemoryBackend,
    path: str | Path,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> ImportReport:
    """Import a JSON-lines file of memories: all checked first, then upserted in batches.

    Args:
        store: where to write (a `MemoryStore`, or any `MemoryBackend`).
        path: the JSON-lines file.
        batch: memories per `add_many` call.
        progress: called after each batch with (written so far, total).

    Returns:
        The counts: lines read, unique memories, stored, repaired, and any write failures.

    Raises:
        MemoryImportError: the file is missing or unreadable, or has bad lines
            (each listed with its number); nothing was written.
    """
    path = Path(path)
    checked = _check_file(path)
    total = len(checked.items)
    failed: list[tuple[MemoryItem, str]] = []
    for start in range(0, total, max(batch, 1)):
        chunk = checked.items[start : start + max(batch, 1)]
        try:
            store.add_many(chunk)
        except MemoryWriteError as exc:  # the rest of the chunk is stored
            failed += [(item, str(error)) for item, error in exc.failed]
        if progress is not None:
            progress(start + len(chunk), total)
    return ImportReport(
        path=path,
        lines=checked.lines,
        unique=total,
        stored=total - len(failed),
        repaired=checked.repaired,
        failed=tuple(failed),
    )
