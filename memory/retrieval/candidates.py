"""What a search reads of Chroma: as little as ranking needs.

A search takes candidates from the embedding's nearest records of each bucket the
reader may read and from the lexical index's best over those buckets
(`memory.retrieval.lexical`), and ranks them by their words and their cosine
(`memory.retrieval.ranking`). The words come from the lexical index, which holds every
readable record's; so Chroma is asked only for ids and distances, for the stored vectors
of the lexical side's records that the embedding's nearest did not hold, and, once
ranked, for the few memories a search returns (`memory.retrieval.search`). Reading every
candidate's document and metadata (~150 records, each unsealed and parsed) was most of a
search's time at 100,000 memories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memory.storage.sealing import Documents

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection


@dataclass(frozen=True)
class Candidate:
    """A record a search may return: a memory, or an alias that stands for its successor
    (`memory.retrieval.aliases`).

    Attributes:
        bucket: the bucket it is in.
        record_id: its Chroma id.
        text: its words (an alias's are those of the fact it replaced).
        distance: the cosine distance of its stored vector to the question's.
    """

    bucket: str
    record_id: str
    text: str
    distance: float


def nearest_distances(collection: Collection, vector: Any, n: int) -> dict[str, float]:
    """The `n` records nearest to `vector` (Chroma caps `n` at the collection's count):
    id → cosine distance, nearest first."""
    found: Mapping[str, Any] = collection.query(
        query_embeddings=[vector], n_results=n, include=["distances"]
    )
    return dict(zip(found["ids"][0], found["distances"][0], strict=True))


def stored_distances(collection: Collection, ids: Sequence[str], vector: Any) -> dict[str, float]:
    """The cosine distance of these records' stored vectors to `vector`: id → distance."""
    got: Mapping[str, Any] = collection.get(ids=list(ids), include=["embeddings"])
    if not got["ids"]:
        return {}
    stored = np.asarray(got["embeddings"], dtype=np.float32)
    query = np.asarray(vector, dtype=np.float32)
    norms = np.linalg.norm(stored, axis=1) * max(float(np.linalg.norm(query)), 1e-12)
    distances = 1.0 - (stored @ query) / np.maximum(norms, 1e-12)
    return {i: float(d) for i, d in zip(got["ids"], distances, strict=True)}


def stored_texts(
    collection: Collection, ids: Sequence[str], documents: Documents
) -> dict[str, str]:
    """These records' words read from Chroma (those the lexical index does not hold yet:
    another client wrote them since it last caught up); unreadable ones left out."""
    got: Mapping[str, Any] = collection.get(ids=list(ids), include=["documents"])
    texts = documents.unseal(got["ids"], got["documents"])
    return {i: t for i, t in zip(got["ids"], texts, strict=True) if t is not None}
