"""A store's Chroma client: how it is opened, which lock its checked writes take, and how
it is closed.

An embedded folder is made ready before Chroma reads it (what a crash left scrubbed,
text an earlier version kept in the clear sealed, an interrupted rebuild finished), and
the write lock is chosen by where the store lives. Kept apart from `memory.store`, which
wires these into one facade, because none of it touches a memory: it is the client's
life, before the first read and after the last.
"""

from __future__ import annotations

from pathlib import Path

from chromadb.api import ClientAPI
from chromadb.config import Settings

from memory.storage.clear_text import finish_rebuild, has_clear_text, seal_clear_text
from memory.storage.erasure import scrub_pending
from memory.storage.lock import WriteLock


def chroma_settings() -> Settings:
    return Settings(anonymized_telemetry=False)


def prepare_folder(folder: Path) -> None:
    """Make an embedded store's folder ready for Chroma (called with the folder locked)."""
    scrub_pending(folder)  # what a crash left, before Chroma reads the folder
    if has_clear_text(folder):  # written by an earlier version: sealed once
        seal_clear_text(folder)
    finish_rebuild(folder)


def write_lock(
    client: ClientAPI, settings: Settings, folder: Path | None, keys: str | Path | None
) -> WriteLock:
    """The lock of the store's checked writes: an embedded store's folder (its processes are
    kept apart for the store's life by `StoreLock`); a server's address, with the key ring's
    folder its processes share, if any; or this client alone (an in-memory one)."""
    if folder is not None:
        return WriteLock(str(folder))
    if settings.chroma_server_host:
        address = f"{settings.chroma_server_host}:{settings.chroma_server_http_port}"
        return WriteLock(address, Path(keys).resolve() if keys is not None else None)
    return WriteLock(f"client {id(client)}")


def close_client(client: ClientAPI) -> None:
    close = getattr(client, "close", None)  # Chroma's clients have it (the API type does not)
    if callable(close):
        close()
