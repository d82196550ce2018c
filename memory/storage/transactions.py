"""SQLite transactions for the store's own files (the key ring) and the extraction ledger."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def immediate_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One transaction on an autocommit connection that holds the database's write lock from
    its first read on (`begin immediate`), committed once: one sync for a batch of writes."""
    db.execute("begin immediate")
    try:
        yield
    except BaseException:
        db.execute("rollback")
        raise
    db.execute("commit")
