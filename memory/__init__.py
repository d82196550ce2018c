"""Scoped long-term memory for the loop.

Every name is imported on first use (`nodes.kernel.lazy`): reading a transcript needs
no Chroma, and `cyrene --help` none of the loop.
"""

from typing import TYPE_CHECKING

from nodes.kernel.lazy import lazy_exports

if TYPE_CHECKING:
    from memory.embedding import HashingEmbedding as HashingEmbedding
    from memory.embedding import MultilingualEmbedding as MultilingualEmbedding
    from memory.errors import MemoryStoreError as MemoryStoreError
    from memory.errors import MemoryWriteError as MemoryWriteError
    from memory.errors import StoreInUseError as StoreInUseError
    from memory.errors import StoreLayoutError as StoreLayoutError
    from memory.items import MemoryItem as MemoryItem
    from memory.items import Scope as Scope
    from memory.items import Source as Source
    from memory.lifecycle.history import HistoryEntry as HistoryEntry
    from memory.lifecycle.operations import Add as Add
    from memory.lifecycle.operations import Change as Change
    from memory.lifecycle.operations import Forget as Forget
    from memory.lifecycle.operations import Recalled as Recalled
    from memory.lifecycle.operations import Restated as Restated
    from memory.lifecycle.operations import Supersede as Supersede
    from memory.protocols import AppliesChanges as AppliesChanges
    from memory.protocols import Extractor as Extractor
    from memory.protocols import ExtractsOperations as ExtractsOperations
    from memory.protocols import FindsNeighbours as FindsNeighbours
    from memory.protocols import MemoryBackend as MemoryBackend
    from memory.protocols import PrunesExtractions as PrunesExtractions
    from memory.protocols import RanksByRelevance as RanksByRelevance
    from memory.retrieval.block import format_memory_block as format_memory_block
    from memory.retrieval.ranking import Decay as Decay
    from memory.retrieval.ranking import Fusion as Fusion
    from memory.retrieval.ranking import SearchResult as SearchResult
    from memory.store import MemoryStore as MemoryStore

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Decay": "memory.retrieval.ranking",
        "AppliesChanges": "memory.protocols",
        "ExtractsOperations": "memory.protocols",
        "HistoryEntry": "memory.lifecycle.history",
        "Supersede": "memory.lifecycle.operations",
        "Recalled": "memory.lifecycle.operations",
        "Restated": "memory.lifecycle.operations",
        "Forget": "memory.lifecycle.operations",
        "Change": "memory.lifecycle.operations",
        "Add": "memory.lifecycle.operations",
        "Extractor": "memory.protocols",
        "FindsNeighbours": "memory.protocols",
        "Fusion": "memory.retrieval.ranking",
        "HashingEmbedding": "memory.embedding",
        "MemoryBackend": "memory.protocols",
        "MemoryItem": "memory.items",
        "MemoryStore": "memory.store",
        "MemoryStoreError": "memory.errors",
        "MemoryWriteError": "memory.errors",
        "MultilingualEmbedding": "memory.embedding",
        "PrunesExtractions": "memory.protocols",
        "RanksByRelevance": "memory.protocols",
        "Scope": "memory.items",
        "SearchResult": "memory.retrieval.ranking",
        "Source": "memory.items",
        "StoreInUseError": "memory.errors",
        "StoreLayoutError": "memory.errors",
        "format_memory_block": "memory.retrieval.block",
    },
)
__all__ = [
    "Add",
    "AppliesChanges",
    "Change",
    "Decay",
    "Extractor",
    "ExtractsOperations",
    "FindsNeighbours",
    "Forget",
    "Fusion",
    "HashingEmbedding",
    "HistoryEntry",
    "MemoryBackend",
    "MemoryItem",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryWriteError",
    "MultilingualEmbedding",
    "PrunesExtractions",
    "RanksByRelevance",
    "Recalled",
    "Restated",
    "Scope",
    "SearchResult",
    "Source",
    "StoreInUseError",
    "StoreLayoutError",
    "Supersede",
    "format_memory_block",
]
