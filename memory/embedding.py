"""An offline default embedding: hashed character n-grams, Chinese and English alike.

Chroma's own default (all-MiniLM via ONNX) downloads a model at first use and
fails on a machine without internet. This one needs nothing: it hashes CJK
character unigrams and bigrams and Latin word unigrams and character trigrams
into a fixed number of signed buckets, then L2-normalises, so cosine
similarity measures shared wording. It is lexical, not semantic: for meaning
("tea" ≈ "oolong") pass a real model, e.g.

    from chromadb.utils.embedding_functions import SentenceTransformerEmbeddingFunction
    MemoryStore.open(path, embedding_function=SentenceTransformerEmbeddingFunction("all-MiniLM-L6-v2"))

(with the model already on disk), or any other Chroma embedding function.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

DEFAULT_DIMENSIONS = 384
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")


def features(text: str) -> list[str]:
    """The n-grams a text is embedded from."""
    grams: list[str] = []
    for token in _TOKEN.findall(text.casefold()):
        if _IS_CJK.match(token):
            grams.extend(token)
            grams.extend(token[i : i + 2] for i in range(len(token) - 1))
        else:
            grams.append(token)
            padded = f"#{token}#"
            grams.extend(padded[i : i + 3] for i in range(len(padded) - 2))
    return grams


@register_embedding_function
class HashingEmbedding(EmbeddingFunction[Documents]):
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

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]

    def get_config(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashingEmbedding:
        return HashingEmbedding(int(config.get("dimensions", DEFAULT_DIMENSIONS)))
