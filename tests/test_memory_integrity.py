"""One writer to the store's files (issue 29, finding 1).

A forget erases the memory's text from the embedded store's files. Chroma's Rust
core has a SQLite of its own; a second SQLite in the same process writing
`chroma.sqlite3` while Chroma has it open treats Chroma's journal as hot and rolls
it back ("database disk image is malformed"). So no connection of ours touches
Chroma's files while Chroma has them open: the text is sealed before Chroma sees
it, and a forget destroys its key (`memory.storage.sealing`). Forgets run beside every
public reader and writer here, and the file must pass `PRAGMA integrity_check`
afterwards, with every forgotten text gone from the store's files. A store an
earlier version wrote in the clear is sealed on open, and its clear copies are
scrubbed with Chroma closed.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memory import MemoryItem, MemoryStore, Scope
from memory.embedding import HashingEmbedding
from memory.lifecycle.history import History
from memory.storage.sealing import Plain
from tests.conftest import REPO, chroma_run, free_port

MEMORIES = 120
FORGETS = 8


def items() -> list[MemoryItem]:
    return [
        MemoryItem(
            content=f"主人的第{i}条记忆：密码{i:04d} note {i}", kind="note", scope=Scope.USER
        )
        if i % 3
        else MemoryItem(
            content=f"昔涟私下记得第{i}件事 secret {i:04d}",
            kind="daily",
            scope=Scope.PERSONA,
            persona_id="xilian",
        )
        for i in range(MEMORIES)
    ]


READERS: dict[str, Callable[[MemoryStore, list[str]], Any]] = {
    "search": lambda s, ids: s.search("主人的记忆 note", persona_id="xilian", k=5),
    "relevant": lambda s, ids: s.relevant("密码", persona_id="xilian", k=5),
    "nearest": lambda s, ids: s.nearest("主人的第7条记忆", persona_id="xilian", k=3),
    "get": lambda s, ids: [s.get(i) for i in ids[:5]],
    "history": lambda s, ids: [s.history(i) for i in ids[:3]],
    "list": lambda s, ids: s.list(),
    "prune": lambda s, ids: s.prune_extractions({"nobody": set()}),
    "a missing bucket": lambda s, ids: s.search("x", persona_id=f"p{time.monotonic_ns()}"),
    "add": lambda s, ids: s.add(
        MemoryItem(content=f"新记忆 {time.monotonic_ns()}", kind="note", scope=Scope.USER)
    ),
    "supersede": lambda s, ids: s.supersede(
        ids[-1], MemoryItem(content=f"更新 {time.monotonic_ns()}", kind="note", scope=Scope.USER)
    ),
}


def race(store: MemoryStore, reader: Callable[[MemoryStore, list[str]], Any]) -> list[str]:
    """Forget `FORGETS` memories while another thread keeps calling `reader`; the texts
    forgotten. A reader's own failure fails the test."""
    stored = store.list()
    ids = [m.id for m in stored]
    doomed = [m for m in stored if m.id not in ids[:5] and m.id != ids[-1]][:FORGETS]
    done = threading.Event()
    errors: list[BaseException] = []

    def keep_reading() -> None:
        while not done.is_set():
            try:
                reader(store, ids)
            except BaseException as exc:  # the store broke under the reader
                errors.append(exc)
                return

    thread = threading.Thread(target=keep_reading)
    thread.start()
    try:
        for memory in doomed:
            assert store.forget(memory.id)
    finally:
        done.set()
        thread.join(60)
    assert not errors, errors[0]
    return [m.content for m in doomed]


def integrity(folder: Path) -> list[tuple[str]]:
    with sqlite3.connect(folder / "chroma.sqlite3") as db:
        return db.execute("pragma integrity_check").fetchall()


def on_disk(folder: Path) -> bytes:
    """Every byte of every file under the store's folder."""
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("reader", READERS)
def test_forgets_beside_every_public_reader_and_writer_never_corrupt(tmp_path, reader):
    folder = tmp_path / "memory"
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as store:
        store.add_many(items())
        forgotten = race(store, READERS[reader])
        assert all(
            store.search(text, persona_id="xilian", k=3) == []
            or all(hit.item.content != text for hit in store.search(text, persona_id="xilian", k=3))
            for text in forgotten
        )
    assert integrity(folder) == [("ok",)]
    files = on_disk(folder)
    assert not [t for t in forgotten if t.encode() in files], "a forgotten text is on disk"
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as again:
        assert len(again.list()) >= MEMORIES - FORGETS


def indexed(store: MemoryStore, word: str) -> list[str]:
    """The records the lexical index finds for `word`, in every bucket."""
    buckets = store.readable_buckets("xilian", restricted=False)
    return [i for ids in store._lexical.search([word], buckets, 50).values() for i in ids]


def test_a_forget_is_erased_from_the_files_while_the_store_stays_open(tmp_path):
    """From Chroma's files, the lexical index and every other file under the data folder
    (the index lives in RAM: no file of it may hold the words either), the superseded
    version's words (an alias in the index) included."""
    folder = tmp_path / "memory"
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as store:
        store.add_many(items())
        memory = store.list()[10]
        old = MemoryItem(content="主人的保险柜密码是 zephyr4417", scope=Scope.USER)
        store.add(old)
        new = MemoryItem(content="主人的保险柜密码改成了 quokka9902", scope=Scope.USER)
        store.supersede(old.id, new)
        assert indexed(store, "zephyr4417") and indexed(store, "quokka9902")
        assert store.search("zephyr4417", k=1)[0].item.id == new.id
        store.forget(memory.id)
        store.forget(new.id)
        assert memory.content.encode() not in (folder / "chroma.sqlite3").read_bytes()
        assert indexed(store, "zephyr4417") == indexed(store, "quokka9902") == []
        assert all(store._lexical.text(i) is None for i in (memory.id, old.id, new.id))
        assert store.search("主人的记忆", k=3), "the store goes on after the erasure"
        gone = [memory.content, old.content, new.content, "zephyr4417", "quokka9902"]
        files = on_disk(tmp_path)
        assert not [t for t in gone if t.encode() in files], "a forgotten text is in a file"
    assert integrity(folder) == [("ok",)]
    files = on_disk(tmp_path)
    assert not [t for t in gone if t.encode() in files], "a forgotten text is in a file"


@pytest.mark.slow
@pytest.mark.services
@pytest.mark.parametrize("reader", ["search", "get", "history", "list", "add"])
def test_forgets_beside_readers_on_a_chroma_server(tmp_path, reader):
    port = free_port()
    with chroma_run(tmp_path, port):
        store = MemoryStore.connect(port=port, embedding_function=HashingEmbedding())
        store.add_many(items())
        race(store, READERS[reader])
        assert len(store.list()) >= MEMORIES - FORGETS
        store.close()
    assert integrity(tmp_path / "db") == [("ok",)]


def write_in_the_clear(folder: str) -> None:
    """In a child process: the store an earlier version wrote (text in the clear)."""
    written = items()
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as earlier:
        earlier._documents = Plain()
        earlier._history = History(earlier.client, earlier._documents)
        earlier.add_many(written)
        earlier.supersede(
            written[1].id, MemoryItem(content="更新后的事实 update", scope=Scope.USER)
        )


def open_after_upgrade(folder: str) -> None:
    """In a fresh process, as after an upgrade: open the store and check what it holds."""
    written = items()
    with MemoryStore.open(folder, embedding_function=HashingEmbedding()) as store:
        assert {m.content for m in store.list()} == {
            *(m.content for m in written if m.id != written[1].id),
            "更新后的事实 update",
        }
        assert store.history(written[1].id)[0].item.content == written[1].content
        hit = store.search(written[5].content, persona_id="xilian", k=1)[0]
        assert hit.item.id == written[5].id


def in_a_child(function: str, folder: Path) -> None:
    code = f"from tests.test_memory_integrity import *; {function}({str(folder)!r})"
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr


def test_a_store_written_in_the_clear_is_sealed_and_scrubbed_on_open(tmp_path):
    """Each side in a process of its own, as an upgrade is: this one never held the text."""
    folder = tmp_path / "memory"
    in_a_child("write_in_the_clear", folder)
    assert items()[2].content.encode() in (folder / "chroma.sqlite3").read_bytes()
    in_a_child("open_after_upgrade", folder)
    files = on_disk(folder)
    assert not [m.content for m in items() if m.content.encode() in files], "clear copies remain"
    assert integrity(folder) == [("ok",)]


@pytest.mark.slow
@pytest.mark.services
def test_a_forget_through_the_server_cyrene_studio_runs_leaves_no_text(tmp_path, capsys):
    """`cyrene studio` serves the data folder with `chroma run`; its clients share the
    folder's key ring, so the server only ever holds sealed text and a forget (here the
    CLI's, during the server's life) leaves nothing readable in the folder's files."""
    from studio.memory_server import open_store, start_server, stop_server
    from tests.cli_support import cyrene

    data = tmp_path / "data"
    (data / "memory").mkdir(parents=True)
    process, _ = start_server(data)
    try:
        with open_store(data, embedding_function=HashingEmbedding()) as store:
            assert store.erases_text
            secret = MemoryItem(content="主人的银行卡密码是 5566", scope=Scope.USER)
            store.add_many([secret, MemoryItem(content="主人喜欢喝茶", scope=Scope.USER)])
        forgot = cyrene(capsys, "memory", "forget", secret.id, "--data", str(data))
        assert forgot.code == 0 and "in the clear" not in forgot.err
    finally:
        stop_server(data, process)
    files = on_disk(data / "memory")
    assert b"5566" not in files and "主人喜欢喝茶".encode() not in files, "all sealed"
    assert integrity(data / "memory") == [("ok",)]
    with MemoryStore.open(data / "memory", embedding_function=HashingEmbedding()) as store:
        assert [m.content for m in store.list()] == ["主人喜欢喝茶"]


@pytest.mark.slow
@pytest.mark.services
def test_the_folders_server_named_by_address_reads_what_the_ring_sealed(tmp_path):
    """Studio hands its graph the server's address (`$CYRENE_MEMORY_SERVER`): that is the
    folder's own server, so the graph opens what the CLI sealed. A client without the
    folder's key ring gets no text for a sealed memory, never its ciphertext."""
    from studio.memory_server import open_store, start_server, stop_server

    data = tmp_path / "data"
    (data / "memory").mkdir(parents=True)
    process, server = start_server(data)
    try:
        with open_store(data, embedding_function=HashingEmbedding()) as store:
            store.add(MemoryItem(content="主人的猫叫团子", scope=Scope.USER))
        with open_store(data, server.address, embedding_function=HashingEmbedding()) as store:
            assert [r.item.content for r in store.search("猫叫什么", k=3)][:1] == ["主人的猫叫团子"]
        foreign = MemoryStore.connect(port=server.port, embedding_function=HashingEmbedding())
        try:
            seen = [m.content for m in foreign.list()] + [
                r.item.content for r in foreign.search("猫叫什么", k=3)
            ]
            assert not any("cyrene:sealed" in text for text in seen), seen
        finally:
            foreign.close()
    finally:
        stop_server(data, process)


@pytest.mark.slow
@pytest.mark.services
def test_a_forget_on_a_foreign_server_says_what_it_leaves(tmp_path, capsys):
    from tests.cli_support import cyrene

    port = free_port()
    with chroma_run(tmp_path, port):
        store = MemoryStore.connect(port=port, embedding_function=HashingEmbedding())
        assert not store.erases_text
        item = MemoryItem(content="主人喜欢喝茶", scope=Scope.USER)
        store.add(item)
        store.close()
        forgot = cyrene(
            capsys,
            "memory",
            "forget",
            item.id,
            "--memory-server",
            f"127.0.0.1:{port}",
            "--data",
            str(tmp_path / "data"),
        )
    assert forgot.code == 0
    assert "holds memory text in the clear and keeps it in its own files" in forgot.err


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["index", "applied"])
def test_a_crash_around_the_index_update_loses_nothing_and_leaves_one_entry(tmp_path, crash):
    """A background extraction's process is SIGKILLed between its write to Chroma and the
    lexical index's update (`index`), or once both are done but before the ledger marks
    the extraction done (`applied`): the restart applies the extraction again. Then the
    memory is in Chroma and in the index once, search finds it once, and the index holds
    no record Chroma does not (nor the reverse)."""
    from tests.test_extraction_durable import finish, worker

    proc = worker(tmp_path, "turn", KILL_AT=crash)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == -signal.SIGKILL, output
    with MemoryStore.open(tmp_path / "memory") as store:
        assert [i.content for i in store.list()] == ["我喜欢乌龙茶"], "written before the crash"
    after = finish(tmp_path, "recover")
    assert after["memories"] == ["我喜欢乌龙茶"], after["output"]
    assert after["stats"]["succeeded"] == 1, "the restart applied the extraction again"
    with MemoryStore.open(tmp_path / "memory") as store:
        [memory] = store.list()
        hits = [h.item.id for h in store.search("我喜欢喝乌龙茶吗", persona_id="xilian", k=8)]
        assert hits.count(memory.id) == 1
        assert indexed(store, "乌龙茶") == [memory.id]
        chroma = {i for c in store._stored() for i in c.get(include=[])["ids"]}
        in_index = {i for bucket in store._lexical._ids.values() for i in bucket}
        assert in_index == chroma == {memory.id}
