"""Scoped long-term memory for the loop (DESIGN §4).

Every name is imported on first use (`memory.lazy`): reading a transcript needs
no Chroma, and `cyrene --help` none of the loop.
"""

from typing import TYPE_CHECKING

from memory.lazy import lazy_exports

if TYPE_CHECKING:
    from memory.background import wait_for_extractions as wait_for_extractions
    from memory.block import format_memory_block as format_memory_block
    from memory.embedding import HashingEmbedding as HashingEmbedding
    from memory.embedding import MultilingualEmbedding as MultilingualEmbedding
    from memory.errors import MemoryStoreError as MemoryStoreError
    from memory.errors import MemoryWriteError as MemoryWriteError
    from memory.errors import StoreInUseError as StoreInUseError
    from memory.errors import StoreLayoutError as StoreLayoutError
    from memory.extraction_ledger import ExtractionLedger as ExtractionLedger
    from memory.extractors import LLMExtractor as LLMExtractor
    from memory.extractors import ManualExtractor as ManualExtractor
    from memory.history import HistoryEntry as HistoryEntry
    from memory.items import MemoryItem as MemoryItem
    from memory.items import Scope as Scope
    from memory.items import Source as Source
    from memory.operations import Add as Add
    from memory.operations import Change as Change
    from memory.operations import Forget as Forget
    from memory.operations import Recalled as Recalled
    from memory.operations import Supersede as Supersede
    from memory.protocols import AppliesChanges as AppliesChanges
    from memory.protocols import Extractor as Extractor
    from memory.protocols import ExtractsOperations as ExtractsOperations
    from memory.protocols import FindsNeighbours as FindsNeighbours
    from memory.protocols import MemoryBackend as MemoryBackend
    from memory.protocols import ProvidesExtractionLedger as ProvidesExtractionLedger
    from memory.protocols import PrunesExtractions as PrunesExtractions
    from memory.protocols import RanksByRelevance as RanksByRelevance
    from memory.ranking import Decay as Decay
    from memory.ranking import Fusion as Fusion
    from memory.ranking import SearchResult as SearchResult
    from memory.store import MemoryStore as MemoryStore

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Decay": "memory.ranking",
        "AppliesChanges": "memory.protocols",
        "ExtractsOperations": "memory.protocols",
        "HistoryEntry": "memory.history",
        "Supersede": "memory.operations",
        "Recalled": "memory.operations",
        "Forget": "memory.operations",
        "Change": "memory.operations",
        "Add": "memory.operations",
        "ExtractionLedger": "memory.extraction_ledger",
        "Extractor": "memory.protocols",
        "FindsNeighbours": "memory.protocols",
        "Fusion": "memory.ranking",
        "HashingEmbedding": "memory.embedding",
        "LLMExtractor": "memory.extractors",
        "ManualExtractor": "memory.extractors",
        "MemoryBackend": "memory.protocols",
        "MemoryItem": "memory.items",
        "MemoryStore": "memory.store",
        "MemoryStoreError": "memory.errors",
        "MemoryWriteError": "memory.errors",
        "MultilingualEmbedding": "memory.embedding",
        "ProvidesExtractionLedger": "memory.protocols",
        "PrunesExtractions": "memory.protocols",
        "RanksByRelevance": "memory.protocols",
        "Scope": "memory.items",
        "SearchResult": "memory.ranking",
        "Source": "memory.items",
        "StoreInUseError": "memory.errors",
        "StoreLayoutError": "memory.errors",
        "format_memory_block": "memory.block",
        "wait_for_extractions": "memory.background",
    },
)
__all__ = [
    "Add",
    "AppliesChanges",
    "Change",
    "Decay",
    "ExtractionLedger",
    "Extractor",
    "ExtractsOperations",
    "FindsNeighbours",
    "Forget",
    "Fusion",
    "HashingEmbedding",
    "HistoryEntry",
    "LLMExtractor",
    "ManualExtractor",
    "MemoryBackend",
    "MemoryItem",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryWriteError",
    "MultilingualEmbedding",
    "ProvidesExtractionLedger",
    "PrunesExtractions",
    "RanksByRelevance",
    "Recalled",
    "Scope",
    "SearchResult",
    "Source",
    "StoreInUseError",
    "StoreLayoutError",
    "Supersede",
    "format_memory_block",
    "wait_for_extractions",
]
