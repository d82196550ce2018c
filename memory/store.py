"""`MemoryStore`: scoped long-term memory in Chroma, embedded or served.

One collection per scope bucket (`memory.storage.buckets`: isolation is structural),
and search checks each hit's stored persona as a second guard.

    with MemoryStore.open("./.cyrene/memory") as store:      # embedded, one process
        ...
    store = MemoryStore.connect(host="127.0.0.1", port=8000)  # a `chroma run` server
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import chromadb
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection

from memory.embedding import MultilingualEmbedding
from memory.errors import MemoryStoreError, MemoryWriteError
from memory.items import MemoryItem, require_owner
from memory.lifecycle.changes import Lifecycle
from memory.lifecycle.history import ForgottenTurns, History
from memory.retrieval.lexical import LexicalIndex
from memory.retrieval.ranking import MIN_RELEVANCE, Decay, Fusion
from memory.retrieval.search import Search
from memory.storage.buckets import Buckets
from memory.storage.clients import chroma_settings, close_client, prepare_folder, write_lock
from memory.storage.erasure import Gate, checkpoint_ledger, exclusively, gated
from memory.storage.layout import migrate
from memory.storage.lock import DEFAULT_LOCK_TIMEOUT, StoreLock
from memory.storage.records import item_key, prune
from memory.storage.reembed import Progress, reembed_store
from memory.storage.sealing import Documents, KeyRing, Plain, Sealed

log = logging.getLogger("cyrene.memory")

_warned_clear_server = False


def _warn_clear_server() -> None:
    global _warned_clear_server
    _warned_clear_server = True
    log.warning(
        "memory forgotten on a Chroma server that holds text in the clear: the server keeps "
        "it in its own files (its log, full-text index, freed pages) until it compacts them"
    )


class MemoryStore(Search, Lifecycle, AbstractContextManager["MemoryStore"]):
    """Scoped memories, read and searched densely and lexically (`memory.retrieval.search`),
    that supersede and forget (`memory.lifecycle.changes`).

    Opening a store written with another embedding re-embeds it in place first
    (`memory.storage.reembed`), reporting to `progress(collection, done, total)`.

    Attributes:
        failed_writes: how many items `add_many` could not store, over the store's life.
    """

    def __init__(
        self,
        client: ClientAPI,
        *,
        embedding_function: Any = None,
        decay: Decay | None = None,
        min_relevance: float = MIN_RELEVANCE,
        clock: Callable[[], float] = time.time,
        lock: StoreLock | None = None,
        fusion: Fusion | None = None,
        progress: Progress | None = None,
        keys: str | Path | None = None,
    ) -> None:
        self.client = client
        self.embedding_function: Any = embedding_function or MultilingualEmbedding()
        self.fusion = fusion or Fusion()
        self.decay = decay or Decay()
        self.min_relevance = min_relevance
        self.clock = clock
        self.failed_writes = 0
        self._lock = lock
        self._closed = False
        self._gate = Gate()
        settings = client.get_settings()
        persistent = settings.is_persistent and settings.persist_directory
        self._folder = Path(settings.persist_directory) if persistent else None
        ring = self._folder or (Path(keys) if keys is not None else None)
        self._keys = KeyRing(ring) if ring is not None else None
        self._writes = write_lock(client, settings, self._folder, keys)
        self._documents: Documents = Sealed(self._keys) if self._keys is not None else Plain()
        """How memory text is kept in Chroma: sealed in an embedded store (`memory.storage.sealing`)."""
        self._buckets = Buckets(client, self.embedding_function, self._live)
        self._history = History(client, self._documents)
        self._forgotten_turns = ForgottenTurns(self._history)
        # A search reads at most three buckets: the persona's, user and project.
        self._bucket_pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="cyrene-memory")
        # Re-embed before the layout migration, which copies stored vectors as they are.
        reembed_store(client, self.embedding_function, self._documents, progress=progress)
        migrate(client, self.embedding_function)
        self._lexical = LexicalIndex()
        self._lexical.load(self._stored(), self._documents)

    @classmethod
    def open(
        cls,
        path: str | Path,
        embedding_function: Any = None,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        **options: Any,
    ) -> MemoryStore:
        """An embedded store under `path`, for this process alone until `close()`.

        Chroma's embedded mode is not safe with several writer processes, so
        the store holds an OS file lock on the folder; another process waits
        for it up to `lock_timeout` seconds. Opening a path this process
        already has open shares that lock (and Chroma's in-process state).

        Args:
            path: the store's folder (created if missing).
            embedding_function: a Chroma embedding function (default: the offline, multilingual
                `MultilingualEmbedding`; `HashingEmbedding()` for lexical matching without a model).
            lock_timeout: seconds to wait for another process to let go.
            **options: `decay`, `min_relevance`, `clock`, `fusion`, `progress` (see the class).

        Returns:
            The open store; use it as a context manager, or call `close()`.

        Raises:
            StoreInUseError: another process still has the store open after `lock_timeout`.
            OSError: the folder cannot be created or locked.
        """
        folder = Path(path).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        lock = StoreLock.acquire(folder, lock_timeout)
        try:
            prepare_folder(folder)
            client = chromadb.PersistentClient(path=str(folder), settings=chroma_settings())
            return cls(client, embedding_function=embedding_function, lock=lock, **options)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 8000,
        embedding_function: Any = None,
        **options: Any,
    ) -> MemoryStore:
        """A store on a Chroma server (`chroma run`): the way to share memory between processes.

        Memory text is sealed when every client shares a key ring on this machine
        (`keys`: the folder the server serves, as `cyrene studio` runs it): a forget
        destroys the key there too. Otherwise the server is given the text in the clear,
        and keeps a forgotten memory's text in its own files until it compacts them
        (docs/memory.md "Lifecycle: facts that change, forgetting, duplicates").

        Args:
            host: the server's host.
            port: the server's port.
            embedding_function: as for `open`; every client of one server must use the same.
            **options: `decay`, `min_relevance`, `clock`, `fusion`, `progress`, and `keys`
                (a folder for the shared key ring).

        Returns:
            The connected store (same API as `open`).

        Raises:
            ValueError: the server cannot be reached (Chroma's own message).
        """
        client = chromadb.HttpClient(host=host, port=port, settings=chroma_settings())
        return cls(client, embedding_function=embedding_function, **options)

    # -- lifecycle ---------------------------------------------------------
    @exclusively
    def close(self) -> None:
        """Release the search threads, cached collections, the client and the folder lock,
        once every call in flight has returned.

        Idempotent. Any later call on this store raises `MemoryStoreError`.
        """
        if self._closed:
            return
        self._closed = True
        self._bucket_pool.shutdown(wait=True)
        self._buckets.cached.clear()
        # The last client of an embedded path stops Chroma's system for it.
        close_client(self.client)
        if self._keys is not None:
            self._keys.close()
        if self._lock is not None:
            self._lock.release()

    @property
    def erases_text(self) -> bool:
        """Whether a forget makes the text unreadable in every file of the store (sealed
        text: embedded, or a server sharing this machine's key ring)."""
        return self._keys is not None

    def _erase(self, ids: builtins.list[str]) -> None:
        """Make these deleted records' text unreadable for good: their keys are destroyed
        (`memory.storage.sealing`), and the ledger's log, where a plan once held the text, is
        checkpointed away. A server given the text in the clear keeps it (logged once)."""
        self._documents.forget(ids)
        self._lexical.remove(ids)
        if self._folder is not None:
            checkpoint_ledger(self._folder)
        elif not self.erases_text and not _warned_clear_server:
            _warn_clear_server()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _live(self) -> None:
        if self._closed:
            raise MemoryStoreError("this memory store is closed; open it again to use it")

    @property
    def folder(self) -> Path | None:
        """The folder of an embedded store's files (None on a Chroma server): the extraction
        ledger and other files of ours sit beside Chroma's there."""
        return self._folder

    @exclusively
    def reindex(self, *, everything: bool = False, progress: Progress | None = None) -> int:
        """Re-embed what another embedding wrote (every memory if `everything`), crash-safe.

        Opening a store already does the first; this is for a store shared on a
        server, or to rebuild every vector (`everything`), e.g. after the
        embedding package changed its model.

        Args:
            everything: re-embed every collection, not only those of another embedding.
            progress: called with (collection, records done, records in it).

        Returns:
            How many memories were re-embedded.
        """
        self._live()
        self._buckets.forget_cached()  # rebuilt collections are new objects
        done = reembed_store(
            self.client,
            self.embedding_function,
            self._documents,
            everything=everything,
            progress=progress,
        )
        self._lexical.load(self._stored(), self._documents)  # what a rebuild moved
        return done

    # -- collections -------------------------------------------------------
    def _collection(self, bucket: str, *, create: bool) -> Collection | None:
        return self._buckets.collection(bucket, create=create)

    def _stored(self) -> builtins.list[Collection]:
        """Every bucket collection that exists (for reads that compute no embeddings)."""
        return self._buckets.stored()

    def _stored_ids(self, ids: builtins.list[str]) -> set[str]:
        """Which of these ids are live memories (in any bucket)."""
        return self._buckets.stored_ids(ids)

    def _find(self, item_id: str) -> tuple[Collection, Mapping[str, Any]] | None:
        return self._buckets.find(item_id, self._documents)

    # -- writes ------------------------------------------------------------
    @gated
    def add(self, item: MemoryItem) -> str:
        """Store (or update) one memory.

        Args:
            item: the memory; a persona-scope item must name its persona.

        Returns:
            The item's id.

        Raises:
            ValueError: a persona-scope item without `persona_id`.
            MemoryWriteError: Chroma refused the write.
        """
        return self.add_many([item])[0]

    @gated
    def add_many(self, items: Iterable[MemoryItem]) -> builtins.list[str]:
        """Store memories, one upsert per bucket and batch; a repeat id is written once.

        Everything is checked before anything is written. Repeats (same id)
        collapse, the last copy winning. A batch Chroma refuses is retried
        item by item, so one bad item never loses the others: the bad ones
        are logged, counted in `failed_writes` and reported by the error.

        Args:
            items: the memories.

        Returns:
            The ids, one per given item, in order.

        Raises:
            TypeError: an element is not a `MemoryItem` (nothing is written).
            ValueError: a persona-scope item without `persona_id` (nothing is written).
            MemoryWriteError: some items could not be stored; every other one was.
        """
        return self._write(items)

    def _write(self, items: Iterable[MemoryItem]) -> builtins.list[str]:
        """`add_many`'s write (lifecycle steps call it within their own hold of the gate)."""
        items = builtins.list(items)
        for item in items:
            if not isinstance(item, MemoryItem):
                raise TypeError(f"add_many: expected MemoryItem, got {type(item).__name__}")
            require_owner(item)
        unique = {item_key(item): item for item in items}  # the last copy of a repeat wins
        failed = self._buckets.upsert(unique.values(), self._documents, self._lexical.put)
        if failed:
            self.failed_writes += len(failed)
            for item, exc in failed:
                log.warning("memory %s could not be stored: %s", item.id, exc)
            bad = {item_key(item) for item, _ in failed}
            raise MemoryWriteError([i for i in unique if i not in bad], failed)
        return [item_key(item) for item in items]

    @gated
    def prune_extractions(self, written: Mapping[str, Set[str]]) -> int:
        """Delete what an interrupted run of these background extractions stored and their
        latest run did not write again (`memory.protocols.PrunesExtractions`).

        Args:
            written: extraction key → the ids of the items its latest run wrote.

        Returns:
            How many memories were deleted.
        """
        pruned = [prune(collection, written) for collection in self._stored()]
        self._lexical.remove(i for memories, aliases in pruned for i in (*memories, *aliases))
        return sum(len(memories) for memories, _ in pruned)
