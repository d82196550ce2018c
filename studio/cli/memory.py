"""`cyrene memory add|search|list|history|forget|import|export|reindex` over the data folder's store.

The parser half imports only argparse (`cyrene --help` builds it); the
commands load the store when they run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from studio.cli.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from studio.text import Reembedding, progress_bar, visible

if TYPE_CHECKING:
    from memory.store import MemoryStore

WRITES = ("add", "forget", "import", "reindex")
IMPORT_BATCH = 500
SCOPES = ("user", "project", "persona")
"""`memory.Scope`'s values (tests/test_cli.py checks they agree)."""
IMPORT_FORMAT = """\
One memory per line, as JSON (what `cyrene memory export` writes); blank lines
are skipped. Only "content" is required:
  {"content": "主人养了一只猫叫团子", "kind": "fact", "scope": "user"}
  {"content": "和主人约好周末爬山", "scope": "persona", "persona_id": "xilian"}
Fields: content (text), kind (a label, default "fact"), scope (user, project or
persona; default user), persona_id (required with scope persona), created_at
(Unix seconds, default now), source ({"session_id", "message_id"}), id (default:
derived from scope, persona and content, so the same memory imported twice is
stored once). The whole file is checked first: if any line is bad, every bad
line is listed with its number and nothing is imported."""


def add_memory_parser(
    memory: argparse.ArgumentParser, options: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The actions under `cyrene memory`; `options` adds the shared options to each."""
    actions = memory.add_subparsers(dest="action", required=True)

    def action(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        made = actions.add_parser(
            name,
            help=help,
            description=description or help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        options(made)
        return made

    add = action("add", "store one memory")
    add.add_argument("content", help="what to remember")
    add.add_argument("--kind", default="note", help="a label, e.g. habit, fact (note)")
    add.add_argument(
        "--scope", default="user", choices=SCOPES, help="who reads it (user: every persona)"
    )
    search = action("search", "the memories a persona's turn would be shown")
    search.add_argument("query", help="what to look for")
    search.add_argument(
        "--restricted", action="store_true", help="as a group or stranger chat sees them"
    )
    search.add_argument("-k", type=int, default=8, help="how many (8)")
    action("list", "every memory: id, bucket, kind, content")
    action(
        "history",
        "a memory's chain: what it replaced, and what replaced it or when it was forgotten",
    ).add_argument("id", help="its id (from list), or a superseded one's")
    action(
        "forget",
        "forget one memory and the memories it replaced (their text leaves the store)",
    ).add_argument("id", help="its id (from list)")
    imports = action("import", "import memories from a JSON-lines file", IMPORT_FORMAT)
    imports.add_argument("file", type=Path, help="the .jsonl file")
    action("export", "every memory as JSON lines (the import format)")
    reindex = action(
        "reindex",
        "re-embed memories another embedding wrote (e.g. the old lexical default); opening "
        "the store does it too, this runs it now, shows progress and reports the count",
    )
    reindex.add_argument(
        "--all", action="store_true", help="re-embed every memory, not only the mismatched ones"
    )


def memory_command(args: argparse.Namespace) -> int:
    from studio.cli.storage import data_folder, existing_data, open_memory

    if args.action in WRITES:
        data_folder(args.data, write=True)
    elif args.memory_server:  # the memories are on that server, not in the folder
        data_folder(args.data, write=False)
    else:  # opening a missing embedded store would create an empty one
        existing_data(args.data)
    reembedding = Reembedding()
    with open_memory(args, reembedding) as store:
        if args.action == "reindex":  # opening may have done the work: count it too
            return _reindex(store, args, reembedding)
        return _ACTIONS[args.action](store, args)


def _reindex(store: MemoryStore, args: argparse.Namespace, reembedding: Reembedding) -> int:
    store.reindex(everything=args.all, progress=reembedding)
    name = store.embedding_function.name()
    print(f"{sum(reembedding.done.values())} memories re-embedded; every one now uses {name}")
    return EXIT_OK


def _add(store: MemoryStore, args: argparse.Namespace) -> int:
    from memory.items import MemoryItem, Scope

    persona = args.persona if args.scope == "persona" else None
    item = MemoryItem(
        content=args.content, kind=args.kind, scope=Scope(args.scope), persona_id=persona
    )
    print(store.add(item))
    return EXIT_OK


def _search(store: MemoryStore, args: argparse.Namespace) -> int:
    hits = store.search(args.query, persona_id=args.persona, restricted=args.restricted, k=args.k)
    for hit in hits:
        item = hit.item
        print(
            f"{hit.score:.3f}  [{visible(item.kind)}] {visible(item.content)}  ({item.bucket}, {item.id})"
        )
    return EXIT_OK


def _list(store: MemoryStore, args: argparse.Namespace) -> int:
    for item in store.list():
        print(f"{item.id}  {item.bucket:<16} [{visible(item.kind)}] {visible(item.content)}")
    return EXIT_OK


def _history(store: MemoryStore, args: argparse.Namespace) -> int:
    import time

    chain = store.history(args.id)
    if not chain:
        print(f"cyrene: no memory with id {args.id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    for entry in chain:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.at)) if entry.at else ""
        what = f"[{visible(entry.item.kind)}] {visible(entry.item.content)}" if entry.item else ""
        by = f" → {entry.superseded_by}" if entry.superseded_by else ""
        print(f"{entry.item_id}  {entry.state:<10} {when:<16} {what}{by}".rstrip())
    return EXIT_OK


def _export(store: MemoryStore, args: argparse.Namespace) -> int:
    for item in store.list():
        print(item.model_dump_json())  # JSON escapes every control character itself
    return EXIT_OK


def _forget(store: MemoryStore, args: argparse.Namespace) -> int:
    if store.forget(args.id):
        print(f"forgot {args.id} and the memories it replaced")
        if not store.erases_text:
            print(
                "cyrene: forgotten; this Chroma server holds memory text in the clear and keeps "
                "it in its own files until it compacts them "
                '(docs/memory.md "Lifecycle: facts that change, forgetting, duplicates")',
                file=sys.stderr,
            )
        return EXIT_OK
    print(f"cyrene: no memory with id {args.id!r}", file=sys.stderr)
    return EXIT_NOT_FOUND


def _import(store: MemoryStore, args: argparse.Namespace) -> int:
    """Check the whole file first (every bad line is reported, nothing imported), then
    import it in upsert batches (repeats collapse) and print the counts."""
    from memory.io import MemoryImportError, import_jsonl

    try:
        report = import_jsonl(store, args.file, batch=IMPORT_BATCH, progress=_progress)
    except MemoryImportError as exc:
        for line in str(exc).splitlines():
            print(f"cyrene: {visible(line)}", file=sys.stderr)
        return EXIT_USAGE
    for item, reason in report.failed:
        print(f"cyrene: not stored: {item.id}: {visible(reason)}", file=sys.stderr)
    repeats = report.lines - report.unique
    print(
        f"imported {report.stored} memories from {report.lines} lines "
        f"({repeats} repeats collapsed, {report.repaired} with lone surrogates replaced, "
        f"{len(report.failed)} failed)"
    )
    return EXIT_USAGE if report.failed else EXIT_OK


def _progress(done: int, total: int) -> None:
    progress_bar("", done, total)


_ACTIONS: dict[str, Callable[[MemoryStore, argparse.Namespace], int]] = {
    "add": _add,
    "search": _search,
    "list": _list,
    "history": _history,
    "export": _export,
    "forget": _forget,
    "import": _import,
}
