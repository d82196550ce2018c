"""Scoped long-term memory for the loop (DESIGN §4)."""

from memory.background import wait_for_extractions
from memory.block import format_memory_block
from memory.embedding import HashingEmbedding, MultilingualEmbedding
from memory.errors import MemoryStoreError, MemoryWriteError, StoreInUseError, StoreLayoutError
from memory.extraction_ledger import ExtractionLedger
from memory.extractors import LLMExtractor, ManualExtractor
from memory.items import MemoryItem, Scope, Source
from memory.protocols import Extractor, MemoryBackend, ProvidesExtractionLedger, PrunesExtractions
from memory.ranking import Decay, Fusion, SearchResult
from memory.store import MemoryStore

__all__ = [
    "Decay",
    "ExtractionLedger",
    "Extractor",
    "Fusion",
    "HashingEmbedding",
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
    "Scope",
    "SearchResult",
    "Source",
    "StoreInUseError",
    "StoreLayoutError",
    "format_memory_block",
    "wait_for_extractions",
]
