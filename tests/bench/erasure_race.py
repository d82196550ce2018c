"""Forgets beside every public reader and writer: corruption, errors, and what stays in the files.

    python -m tests.bench.erasure_race                 # 50 trials per reader and deployment
    python -m tests.bench.erasure_race --trials 5      # a quick look
    python -m tests.bench.erasure_race --deployments embedded --readers search,add

For each reader or writer of `MemoryStore` (search, relevant, nearest, get,
history, list, export, prune_extractions, a search of a persona bucket that does
not exist, add, supersede) and each deployment, every trial stores 120 memories
(a third of them a persona's) and then one thread forgets 8 of them one by one
(a random pause of up to 20 ms between them, so that reader calls fall between
forgets) while another calls the reader in a loop until the forgets are done.
Measured after each trial:

- corruption: `PRAGMA integrity_check` of the Chroma folder's `chroma.sqlite3`
  is not `ok` (in a process of its own, read-only; embedded: after the store
  closed; server: while it runs, and once more after it stopped);
- reader errors and forget errors: calls that raised (the first is printed);
- forgotten text in the files: the UTF-8 bytes of a forgotten memory's text in any
  file under the Chroma folder (at the trial's end; for a server also after it
  stopped), and forgotten ids whose key is still in the key ring (sealed only);
- still readable: a forgotten text that `list()` still returns, or an id `get()`
  still finds.

Deployments: `embedded` (`MemoryStore.open`, a fresh folder per trial),
`server-sealed` (`MemoryStore.connect(..., keys=<the server's --path>)`, as
`cyrene studio` runs it) and `server-clear` (`MemoryStore.connect` alone: the server
is given the text in the clear and keeps it in its files by design, so its
"forgotten text in the files" column is expected to be non-zero). A server serves
every trial of one reader; each trial uses its own texts and deletes its
collections at the end. Embeddings are `HashingEmbedding` (no model): the race is
about the files, not recall.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory import MemoryItem, MemoryStore, Scope
from memory.embedding import HashingEmbedding
from memory.storage.erasure import CHROMA_FILE
from memory.storage.sealing import KEYS_FILE
from tests.bench.extraction import chroma_server

MEMORIES = 120
FORGETS = 8
PAUSE = 0.02
DEPLOYMENTS = ("embedded", "server-sealed", "server-clear")

Reader = Callable[[MemoryStore, list[str]], Any]


def _stamp() -> int:
    return time.monotonic_ns()


READERS: dict[str, Reader] = {
    "search": lambda s, ids: s.search("主人的记忆 note", persona_id="xilian", k=5),
    "relevant": lambda s, ids: s.relevant("密码", persona_id="xilian", k=5),
    "nearest": lambda s, ids: s.nearest("主人的第7条记忆", persona_id="xilian", k=3),
    "get": lambda s, ids: [s.get(i) for i in ids],
    "history": lambda s, ids: [s.history(i) for i in ids],
    "list": lambda s, ids: s.list(),
    "export": lambda s, ids: [item.model_dump_json() for item in s.list()],
    "prune_extractions": lambda s, ids: s.prune_extractions({"nobody": set()}),
    "missing bucket": lambda s, ids: s.search("x", persona_id=f"p{_stamp()}"),
    "add": lambda s, ids: s.add(
        MemoryItem(content=f"新记忆 {_stamp()}", kind="note", scope=Scope.USER)
    ),
    "supersede": lambda s, ids: s.supersede(
        ids[-1], MemoryItem(content=f"更新 {_stamp()}", kind="note", scope=Scope.USER)
    ),
}

_INTEGRITY = """
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(db.execute("pragma integrity_check").fetchall())
"""


@dataclass
class Tally:
    """One deployment × reader."""

    trials: int = 0
    corruptions: int = 0
    reader_errors: int = 0
    forget_errors: int = 0
    text_trials: int = 0
    """Trials that left a forgotten text in some file."""
    texts_found: int = 0
    after_stop: int = 0
    """Forgotten texts in a server's files after it stopped (every trial's)."""
    keys_left: int = 0
    readable: int = 0
    calls: list[int] = field(default_factory=list)
    """Reader calls made while each trial's forgets ran."""
    seconds: float = 0.0
    files: set[str] = field(default_factory=set)
    first_error: str = ""


def trial_items(token: str) -> list[MemoryItem]:
    """The trial's memories; `token` makes their texts this trial's own."""
    return [
        MemoryItem(content=f"主人的第{i}条记忆：密码{i:04d} note {token}", scope=Scope.USER)
        if i % 3
        else MemoryItem(
            content=f"昔涟私下记得第{i}件事 secret {token}",
            kind="daily",
            scope=Scope.PERSONA,
            persona_id="xilian",
        )
        for i in range(MEMORIES)
    ]


def targets(ids: list[str], doomed: list[str]) -> list[str]:
    """What `get` and `history` read: three kept ids, three being forgotten, and the one
    `supersede` replaces last."""
    kept = [i for i in ids if i not in doomed]
    return [*kept[:3], *doomed[:3], kept[-1]]


def race(store: MemoryStore, reader: Reader, tally: Tally) -> list[MemoryItem]:
    """Forget `FORGETS` memories while another thread keeps calling `reader`; the memories
    forgotten. Errors are counted in `tally`."""
    stored = store.list()
    ids = [m.id for m in stored if m.id]
    doomed = [m for m in stored[5:-1]][:: max(1, len(stored) // (FORGETS * 2))][:FORGETS]
    doomed_ids = [m.id for m in doomed if m.id]
    read = targets(ids, doomed_ids)
    done, calls, errors = threading.Event(), [0], []

    def keep_reading() -> None:
        while not done.is_set():
            try:
                reader(store, read)
            except Exception as exc:
                errors.append(exc)
            calls[0] += 1

    thread = threading.Thread(target=keep_reading)
    thread.start()
    try:
        for item_id in doomed_ids:
            time.sleep(random.uniform(0, PAUSE))
            try:
                store.forget(item_id)
            except Exception as exc:
                tally.forget_errors += 1
                tally.first_error = tally.first_error or f"forget: {exc!r}"
    finally:
        done.set()
        thread.join(120)
    tally.reader_errors += bool(errors)
    if errors and not tally.first_error:
        tally.first_error = f"reader: {errors[0]!r}"
    tally.calls.append(calls[0])
    return doomed


def still_readable(store: MemoryStore, forgotten: list[MemoryItem]) -> int:
    """Forgotten memories the store still returns (by `list` or `get`)."""
    live = {m.content for m in store.list()}
    return sum(m.content in live or store.get(str(m.id)) is not None for m in forgotten)


def integrity(chroma: Path) -> str:
    """`PRAGMA integrity_check` of a Chroma file, read-only, in a process of its own."""
    checked = subprocess.run(
        [sys.executable, "-I", "-c", _INTEGRITY, str(chroma)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return checked.stdout.strip() or checked.stderr.strip()[-300:]


def files_holding(folder: Path, texts: list[str]) -> tuple[int, set[str]]:
    """How many of `texts` appear in some file under `folder`, and the names of the files
    that hold one (`chroma.sqlite3`, `data_level0.bin`, …)."""
    found: set[str] = set()
    holders: set[str] = set()
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        hits = {t for t in texts if t.encode() in data}
        if hits:
            found |= hits
            holders.add(path.name)
    return len(found), holders


def keys_left(folder: Path, ids: list[str]) -> int:
    """Forgotten ids whose key is still in the folder's key ring."""
    ring = folder / KEYS_FILE
    if not ring.exists():
        return 0
    db = sqlite3.connect(f"file:{ring}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(ids))
        return db.execute(f"select count(*) from keys where id in ({marks})", ids).fetchone()[0]
    finally:
        db.close()


def check_files(folder: Path, forgotten: list[MemoryItem], tally: Tally) -> None:
    """Integrity, forgotten text and keys left in `folder`, into `tally`."""
    checked = integrity(folder / CHROMA_FILE)
    if checked != "[('ok',)]":
        tally.corruptions += 1
        tally.first_error = tally.first_error or f"integrity: {checked}"
    count, holders = files_holding(folder, [m.content for m in forgotten])
    tally.text_trials += bool(count)
    tally.texts_found += count
    tally.files |= holders
    tally.keys_left += keys_left(folder, [str(m.id) for m in forgotten])


def embedded_trial(base: Path, reader: Reader, tally: Tally) -> None:
    folder = base / f"embedded-{uuid.uuid4().hex[:8]}"
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as store:
        store.add_many(trial_items(uuid.uuid4().hex))
        forgotten = race(store, reader, tally)
        tally.readable += still_readable(store, forgotten)
    check_files(folder, forgotten, tally)
    shutil.rmtree(folder)
    tally.trials += 1


def server_trial(port: int, folder: Path, sealed: bool, reader: Reader, tally: Tally) -> list[str]:
    """One trial on a running server; the texts it forgot."""
    keys = folder if sealed else None
    store = MemoryStore.connect(port=port, embedding_function=HashingEmbedding(), keys=keys)
    try:
        store.add_many(trial_items(uuid.uuid4().hex))
        forgotten = race(store, reader, tally)
        tally.readable += still_readable(store, forgotten)
        check_files(folder, forgotten, tally)
        for collection in store.client.list_collections():
            store.client.delete_collection(collection.name)
    finally:
        store.close()
    tally.trials += 1
    return [m.content for m in forgotten]


def run_server(base: Path, deployment: str, reader: Reader, trials: int) -> Tally:
    """Every trial of one reader on one `chroma run`; then the files once it stopped."""
    tally = Tally()
    folder = base / f"{deployment}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    texts: list[str] = []
    with chroma_server(folder) as port:
        for _ in range(trials):
            texts += server_trial(port, folder, deployment == "server-sealed", reader, tally)
    checked = integrity(folder / CHROMA_FILE)
    if checked != "[('ok',)]":
        tally.corruptions += 1
        tally.first_error = tally.first_error or f"integrity after stop: {checked}"
    tally.after_stop, holders = files_holding(folder, texts)
    tally.files |= holders
    shutil.rmtree(folder)
    return tally


def run_embedded(base: Path, reader: Reader, trials: int) -> Tally:
    tally = Tally()
    for _ in range(trials):
        embedded_trial(base, reader, tally)
    return tally


HEADER = (
    "| deployment | reader | trials | corruptions | reader errors | forget errors "
    "| forgotten text in files: trials / texts | after server stop | keys left "
    "| still readable | reader calls per trial (median) | seconds |"
)


def table_row(deployment: str, reader: str, t: Tally) -> str:
    after = str(t.after_stop) if deployment != "embedded" else "—"
    cells = [
        deployment,
        reader,
        t.trials,
        t.corruptions,
        t.reader_errors,
        t.forget_errors,
        f"{t.text_trials} / {t.texts_found}",
        after,
        t.keys_left if deployment != "server-clear" else "—",
        t.readable,
        statistics.median(t.calls) if t.calls else 0,
        f"{t.seconds:.0f}",
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--deployments", default=",".join(DEPLOYMENTS))
    parser.add_argument("--readers", default=",".join(READERS))
    args = parser.parse_args()
    deployments = args.deployments.split(",")
    readers = args.readers.split(",")
    results: list[tuple[str, str, Tally]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for deployment in deployments:
            for name in readers:
                started = time.monotonic()
                tally = (
                    run_embedded(Path(tmp), READERS[name], args.trials)
                    if deployment == "embedded"
                    else run_server(Path(tmp), deployment, READERS[name], args.trials)
                )
                tally.seconds = time.monotonic() - started
                results.append((deployment, name, tally))
                print(table_row(deployment, name, tally), file=sys.stderr, flush=True)
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for deployment, name, tally in results:
        print(table_row(deployment, name, tally))
    for deployment, name, tally in results:
        if tally.first_error or tally.files:
            print(
                f"{deployment} × {name}: {tally.first_error or 'no error'}; "
                f"files holding forgotten text: {sorted(tally.files) or 'none'}"
            )


if __name__ == "__main__":
    main()
