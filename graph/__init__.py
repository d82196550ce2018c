"""Cyrene's agent loop as a LangGraph graph: the public API.

Every name is imported on first use (`nodes.kernel.lazy`), so a reader of one
submodule (`cyrene history`) does not load the whole loop. A feature's settings
(`GroupPresence`, `Compaction`, …) are entries of `LoopConfig(features=[...])`.
"""

from typing import TYPE_CHECKING

from nodes.kernel.lazy import lazy_exports

if TYPE_CHECKING:
    from graph.builder import build_graph as build_graph
    from graph.extractions import aresume_extractions as aresume_extractions
    from graph.extractions import resume_extractions as resume_extractions
    from graph.memory_view import MemoryStoreView as MemoryStoreView
    from graph.sessions import SessionBusyError as SessionBusyError
    from graph.sessions import SessionReentryError as SessionReentryError
    from graph.sessions import SessionWaitTimeout as SessionWaitTimeout
    from graph.sessions.settings import Sessions as Sessions
    from graph.shutdown import GracefulStop as GracefulStop
    from graph.shutdown import StopRequested as StopRequested
    from graph.shutdown import arun_turn as arun_turn
    from graph.shutdown import run_turn as run_turn
    from graph.storage.checkpoint import open_checkpointer as open_checkpointer
    from graph.storage.retention import PruneReport as PruneReport
    from graph.storage.retention import prune_checkpoints as prune_checkpoints
    from nodes.boundary.admission import Trusted as Trusted
    from nodes.capacity.policy import CapacityEvent as CapacityEvent
    from nodes.capacity.policy import CapacityPolicy as CapacityPolicy
    from nodes.capacity.policy import Tier as Tier
    from nodes.compaction.settings import Compaction as Compaction
    from nodes.compaction.settings import Compactor as Compactor
    from nodes.compaction.summary import LLMCompactor as LLMCompactor
    from nodes.compaction.summary import StructuralCompactor as StructuralCompactor
    from nodes.context.settings import ModelView as ModelView
    from nodes.context.speaker_attribution import SpeakerAttribution as SpeakerAttribution
    from nodes.core.config import LoopConfig as LoopConfig
    from nodes.core.config import Persona as Persona
    from nodes.core.env import SessionEnv as SessionEnv
    from nodes.core.feature import Feature as Feature
    from nodes.core.policy import ModelCall as ModelCall
    from nodes.core.policy import Reply as Reply
    from nodes.core.policy import Round as Round
    from nodes.core.policy import RoundPolicy as RoundPolicy
    from nodes.core.state import LoopState as LoopState
    from nodes.core.state import TurnInput as TurnInput
    from nodes.extraction.background import JobStats as JobStats
    from nodes.extraction.background import extraction_stats as extraction_stats
    from nodes.extraction.background import wait_for_extractions as wait_for_extractions
    from nodes.extraction.extractors import LLMExtractor as LLMExtractor
    from nodes.extraction.extractors import ManualExtractor as ManualExtractor
    from nodes.extraction.ledger import ExtractionLedger as ExtractionLedger
    from nodes.extraction.ledger import ProvidesExtractionLedger as ProvidesExtractionLedger
    from nodes.extraction.settings import Extraction as Extraction
    from nodes.fallbacks.settings import Fallbacks as Fallbacks
    from nodes.guards.checks import Guard as Guard
    from nodes.guards.checks import KeywordGuard as KeywordGuard
    from nodes.guards.settings import Guards as Guards
    from nodes.presence.hearing import Hearing as Hearing
    from nodes.presence.hearing import ReplyJudge as ReplyJudge
    from nodes.presence.hearing import ReplyVerdict as ReplyVerdict
    from nodes.presence.judges import LLMReplyJudge as LLMReplyJudge
    from nodes.presence.judges import ReplyScorer as ReplyScorer
    from nodes.presence.settings import GroupPresence as GroupPresence
    from nodes.recall.settings import ConversationRecall as ConversationRecall
    from nodes.thinking.settings import Thinking as Thinking
    from nodes.tools.hooks import AuditEvent as AuditEvent
    from nodes.tools.hooks import ToolHooks as ToolHooks
    from nodes.tools.settings import ToolCalls as ToolCalls
    from nodes.turn_end.settings import TurnEnd as TurnEnd
    from nodes.vision.settings import ImageDescriber as ImageDescriber
    from nodes.vision.settings import Vision as Vision

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AuditEvent": "nodes.tools.hooks",
        "CapacityEvent": "nodes.capacity.policy",
        "CapacityPolicy": "nodes.capacity.policy",
        "Compaction": "nodes.compaction.settings",
        "Compactor": "nodes.compaction.settings",
        "ConversationRecall": "nodes.recall.settings",
        "Extraction": "nodes.extraction.settings",
        "ExtractionLedger": "nodes.extraction.ledger",
        "Fallbacks": "nodes.fallbacks.settings",
        "Feature": "nodes.core.feature",
        "GracefulStop": "graph.shutdown",
        "GroupPresence": "nodes.presence.settings",
        "Guard": "nodes.guards.checks",
        "Guards": "nodes.guards.settings",
        "Hearing": "nodes.presence.hearing",
        "ImageDescriber": "nodes.vision.settings",
        "JobStats": "nodes.extraction.background",
        "KeywordGuard": "nodes.guards.checks",
        "LLMCompactor": "nodes.compaction.summary",
        "LLMExtractor": "nodes.extraction.extractors",
        "LLMReplyJudge": "nodes.presence.judges",
        "LoopConfig": "nodes.core.config",
        "LoopState": "nodes.core.state",
        "ManualExtractor": "nodes.extraction.extractors",
        "MemoryStoreView": "graph.memory_view",
        "ModelCall": "nodes.core.policy",
        "ModelView": "nodes.context.settings",
        "Persona": "nodes.core.config",
        "ProvidesExtractionLedger": "nodes.extraction.ledger",
        "PruneReport": "graph.storage.retention",
        "Reply": "nodes.core.policy",
        "ReplyJudge": "nodes.presence.hearing",
        "ReplyScorer": "nodes.presence.judges",
        "ReplyVerdict": "nodes.presence.hearing",
        "Round": "nodes.core.policy",
        "RoundPolicy": "nodes.core.policy",
        "SessionBusyError": "graph.sessions",
        "SessionEnv": "nodes.core.env",
        "SessionReentryError": "graph.sessions",
        "SessionWaitTimeout": "graph.sessions",
        "Sessions": "graph.sessions.settings",
        "SpeakerAttribution": "nodes.context.speaker_attribution",
        "StopRequested": "graph.shutdown",
        "StructuralCompactor": "nodes.compaction.summary",
        "Thinking": "nodes.thinking.settings",
        "Tier": "nodes.capacity.policy",
        "ToolCalls": "nodes.tools.settings",
        "ToolHooks": "nodes.tools.hooks",
        "Trusted": "nodes.boundary.admission",
        "TurnEnd": "nodes.turn_end.settings",
        "TurnInput": "nodes.core.state",
        "Vision": "nodes.vision.settings",
        "aresume_extractions": "graph.extractions",
        "arun_turn": "graph.shutdown",
        "build_graph": "graph.builder",
        "extraction_stats": "nodes.extraction.background",
        "open_checkpointer": "graph.storage.checkpoint",
        "prune_checkpoints": "graph.storage.retention",
        "resume_extractions": "graph.extractions",
        "run_turn": "graph.shutdown",
        "wait_for_extractions": "nodes.extraction.background",
    },
)
__all__ = [
    "AuditEvent",
    "CapacityEvent",
    "CapacityPolicy",
    "Compaction",
    "Compactor",
    "ConversationRecall",
    "Extraction",
    "ExtractionLedger",
    "Fallbacks",
    "Feature",
    "GracefulStop",
    "GroupPresence",
    "Guard",
    "Guards",
    "Hearing",
    "ImageDescriber",
    "JobStats",
    "KeywordGuard",
    "LLMCompactor",
    "LLMExtractor",
    "LLMReplyJudge",
    "LoopConfig",
    "LoopState",
    "ManualExtractor",
    "MemoryStoreView",
    "ModelCall",
    "ModelView",
    "Persona",
    "ProvidesExtractionLedger",
    "PruneReport",
    "Reply",
    "ReplyJudge",
    "ReplyScorer",
    "ReplyVerdict",
    "Round",
    "RoundPolicy",
    "SessionBusyError",
    "SessionEnv",
    "SessionReentryError",
    "SessionWaitTimeout",
    "Sessions",
    "SpeakerAttribution",
    "StopRequested",
    "StructuralCompactor",
    "Thinking",
    "Tier",
    "ToolCalls",
    "ToolHooks",
    "Trusted",
    "TurnEnd",
    "TurnInput",
    "Vision",
    "aresume_extractions",
    "arun_turn",
    "build_graph",
    "extraction_stats",
    "open_checkpointer",
    "prune_checkpoints",
    "resume_extractions",
    "run_turn",
    "wait_for_extractions",
]
