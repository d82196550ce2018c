"""Forgotten words: what a forget keeps so that the memory's words are not shown again.

A forget erases the memory, but the words it came from may still be in a session's
transcript, which keeps everything the user said. Conversation recall brings archived
messages back to the model, and the compaction summary quotes older ones, so the view
asks the store which of them carry a forgotten memory's words (`ForgottenWords.carried`)
and leaves those out (`nodes.recall.forgotten`); the transcript itself is never changed.

The store keeps no text to recognise them by. At forget, each forgotten memory leaves
a fingerprint: its lexical terms as the store's own analyzer cuts them
(`memory.retrieval.lexical.raw_terms`: Latin words and their trigrams, CJK characters
and bigrams), each as a keyed hash (HMAC-SHA256 with a secret of the store, cut to 64
bits). Content is matched, not a link to a source message: a memory stored by hand
names none, and a reply that echoes the words is no source either. A text carries a
fingerprint when it holds
- an identifying word of the memory: a non-CJK word of `IDENTIFYING_CHARS` characters
  or more with a digit in it (a password, a card or phone number, a plate), which alone
  gives the secret away, so an echo ("好的，记住了：PINxq8842") goes too; or
- at least `COVERAGE` of the memory's distinct terms, and `MIN_HELD` of them: the
  memory said again. A message that shares its topic only ("我的门禁密码是…" against a
  forgotten "我的银行卡密码是…": 8 of 23 terms) stays, and a memory of fewer than
  `MIN_HELD` terms hides nothing by coverage (a forgotten "猫" must not hide every cat).
A message a forgotten memory came from (its `Source.message_id`, which the loop stamps on
what it extracts) is carried whatever its words: an extracted memory is often reworded
("主人的妹妹叫王小丫" from "记住 我妹妹叫王小丫": 10 of its 16 terms). Not caught: another
paraphrase, or an echo of a name or other CJK words alone.

Fingerprints and secrets live in a Chroma collection of their own beside the buckets
(`FORGOTTEN_COLLECTION`, no `bucket` in its metadata, so reads, the layout migration
and re-embedding never take it for memories): every worker of a Chroma server sees
them. Processes of a server share no lock, so two may each make a secret at once:
each fingerprint names the secret it was made with, and a text is hashed under every
secret a fingerprint names (one, but for such a race). Whoever holds the secret can
test a guessed term against a fingerprint, as whoever holds the key ring can read the
live memories; the files hold no forgotten text.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import math
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from memory.embedding import is_cjk_run, runs
from memory.items import MemoryItem
from memory.retrieval.lexical import raw_terms
from memory.storage.records import pages

FORGOTTEN_COLLECTION = "cyrene_forgotten_words"
IDENTIFYING_CHARS = 5
"""A non-CJK word this long or longer with a digit in it identifies its memory alone
(a four-digit year does not)."""
COVERAGE = 2 / 3
"""The share of a memory's distinct terms a text must hold to say the memory again."""
MIN_HELD = 4
"""And how many at least: a short memory's few terms are in too many texts."""
_SECRET_PREFIX = "secret:"
_KEY, _FINGERPRINT = "secret", "fingerprint"  # the two kinds of record
# Chroma wants a vector per record; these are only read by id and metadata.
_POINT: list[Sequence[float]] = [[1.0]]
_HASH_BYTES = 8


def identifying(word: str) -> bool:
    """Whether a word of `runs` gives its memory away alone."""
    return (
        len(word) >= IDENTIFYING_CHARS and not is_cjk_run(word) and any(c.isdigit() for c in word)
    )


def _keyed(secret: bytes, term: str) -> str:
    """A term's keyed hash."""
    return hmac.digest(secret, term.encode(), hashlib.sha256)[:_HASH_BYTES].hex()


_hash = functools.lru_cache(maxsize=65_536)(_keyed)
"""`_keyed`, cached for the texts checked (the same recalled messages come back round after
round); a forgotten text's terms are hashed uncached, to be kept in no cache."""


def needed(size: int) -> int:
    """How many of a fingerprint's `size` distinct terms a text must hold to say it again."""
    return max(MIN_HELD, math.ceil(COVERAGE * size))


class _Under:
    """The fingerprints made with one secret. Each is looked at only for a text that holds
    one of its gate terms: the `size - needed + 1` of its terms fewest fingerprints share,
    of which a text that misses no more than `size - needed` must hold one. Without gates,
    every text's common characters reached every fingerprint (~0.25 ms a text at 100)."""

    def __init__(
        self, secret: bytes, fingerprints: Sequence[tuple[frozenset[str], set[str]]]
    ) -> None:
        self.secret = secret
        self.terms = [terms for terms, _ in fingerprints]
        self.needed = [needed(len(terms)) for terms in self.terms]
        self.identifying = {word for _, words in fingerprints for word in words}
        shared = Counter(term for terms in self.terms for term in terms)
        self.gates: dict[str, list[int]] = {}
        for n, terms in enumerate(self.terms):
            if len(terms) < self.needed[n]:
                continue  # too short to be said again by coverage
            rarest = sorted(terms, key=lambda term: (shared[term], term))
            for term in rarest[: len(terms) - self.needed[n] + 1]:
                self.gates.setdefault(term, []).append(n)

    def carried_by(self, text: str) -> bool:
        held = {_hash(self.secret, t) for t in raw_terms(text)}
        if held & self.identifying:
            return True
        candidates = {n for term in held for n in self.gates.get(term, ())}
        return any(len(self.terms[n] & held) >= self.needed[n] for n in candidates)


@dataclass(frozen=True)
class _Known:
    """What the collection's records said when they were last read."""

    records: int
    by_secret: list[_Under]
    sources: frozenset[str]
    """The ids of the messages forgotten memories came from (`Source.message_id`)."""


class ForgottenWords:
    """The fingerprints of one Chroma client's forgotten memories."""

    def __init__(self, client: ClientAPI) -> None:
        self._client = client
        self._collection: Collection | None = None
        self._lock = threading.Lock()
        self._known = _Known(0, [], frozenset())

    def records(self) -> Collection:
        if self._collection is None:
            self._collection = self._client.get_or_create_collection(
                FORGOTTEN_COLLECTION, embedding_function=None, metadata={"cyrene": "forgotten"}
            )
        return self._collection

    def remember(self, items: Sequence[MemoryItem]) -> None:
        """Fingerprint these memories (before they are erased: a crash between leaves
        the fingerprint, never the words unguarded)."""
        if not items:
            return
        secret_id, secret = self._secret()
        # One record per forgotten text and source, by their keyed hash: a memory id written
        # again with other words and forgotten again adds a fingerprint, never replaces one.
        fingerprints: dict[str, Any] = {}
        for text, source in {(item.content, item.source.message_id) for item in items}:
            terms = sorted({_keyed(secret, t) for t in raw_terms(text)})
            words = sorted({_keyed(secret, w) for w in runs(text) if identifying(w)})
            fingerprints[_keyed(secret, f"{text}\0{source or ''}")] = {
                "kind": _FINGERPRINT,
                "secret": secret_id,
                "terms": " ".join(terms),
                "words": " ".join(words),
                **({"source": source} if source else {}),
            }
        self.records().upsert(
            ids=list(fingerprints),
            embeddings=_POINT * len(fingerprints),
            metadatas=list(fingerprints.values()),
        )

    def carried(self, texts: Sequence[str], ids: Sequence[str | None] | None = None) -> list[bool]:
        """For each text (a message with its id, if `ids` are given), whether it carries a
        forgotten memory's words, or is the message a forgotten memory came from."""
        known = self._fingerprints()
        sources = ids if ids is not None else [None] * len(texts)
        return [
            (source is not None and source in known.sources)
            or any(under.carried_by(text) for under in known.by_secret)
            for text, source in zip(texts, sources, strict=True)
        ]

    def _secret(self) -> tuple[str, bytes]:
        """The secret new fingerprints are made with: the first by id, made if none is."""
        secrets = self._secrets()
        if not secrets:
            made = _SECRET_PREFIX + os.urandom(8).hex()
            key = base64.b64encode(os.urandom(32)).decode()
            meta: Any = {"kind": _KEY, "key": key}
            self.records().add(ids=[made], embeddings=_POINT, metadatas=[meta])
            secrets = self._secrets()  # another process may have made one first
        first = min(secrets)
        return first, secrets[first]

    def _secrets(self) -> dict[str, bytes]:
        got: Mapping[str, Any] = self.records().get(where={"kind": _KEY}, include=["metadatas"])
        return _keys(got["ids"], got["metadatas"])

    def _fingerprints(self) -> _Known:
        """Every fingerprint: read again when the record count changed (records are only
        ever added, one per forgotten text and source: a forget is for good)."""
        collection = self._client_collection()
        if collection is None:
            return self._known
        count = collection.count()
        with self._lock:
            if count == self._known.records:
                return self._known
        ids: list[str] = []
        metas: list[Mapping[str, Any] | None] = []
        for page in pages(collection, ["metadatas"]):
            ids += page["ids"]
            metas += page["metadatas"]
        known = _index(count, ids, metas)
        with self._lock:
            self._known = known
        return known

    def _client_collection(self) -> Collection | None:
        """The collection, if a forget has made it (looked for again until then)."""
        if self._collection is None:
            try:
                self._collection = self._client.get_collection(FORGOTTEN_COLLECTION)
            except (NotFoundError, ValueError):
                return None
        return self._collection


def _index(count: int, ids: Sequence[str], metas: Sequence[Mapping[str, Any] | None]) -> _Known:
    """What these `count` records say: their fingerprints grouped by the secret each was
    made with, and the messages forgotten memories came from."""
    secrets = _keys(ids, metas)
    by_secret: dict[str, list[tuple[frozenset[str], set[str]]]] = {}
    sources: set[str] = set()
    for meta in metas:
        if not meta or meta.get("kind") != _FINGERPRINT or str(meta["secret"]) not in secrets:
            continue
        terms, words = str(meta.get("terms", "")).split(), str(meta.get("words", "")).split()
        by_secret.setdefault(str(meta["secret"]), []).append((frozenset(terms), set(words)))
        if meta.get("source"):
            sources.add(str(meta["source"]))
    under = [_Under(secrets[i], fingerprints) for i, fingerprints in by_secret.items()]
    return _Known(count, under, frozenset(sources))


def _keys(ids: Sequence[str], metas: Sequence[Mapping[str, Any] | None]) -> dict[str, bytes]:
    """The secrets among these records, by id."""
    return {
        i: base64.b64decode(str(m["key"]))
        for i, m in zip(ids, metas, strict=True)
        if m and m.get("kind") == _KEY
    }
