"""Cyrene's agent loop as a LangGraph graph: the public API.

Every name is imported on first use (`nodes.kernel.lazy`), so a reader of one
submodule (`cyrene history`) does not load the whole loop.
"""

from typing import TYPE_CHECKING

from nodes.kernel.lazy import lazy_exports

if TYPE_CHECKING:
    from graph.builder import build_graph as build_graph
    from graph.extractions import aresume_extractions as aresume_extractions
    from graph.extractions import resume_extractions as resume_extractions
    from graph.sessions import SessionBusyError as SessionBusyError
    from graph.sessions import SessionReentryError as SessionReentryError
    from graph.sessions import SessionWaitTimeout as SessionWaitTimeout
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
    from nodes.context.speaker_attribution import SpeakerAttribution as SpeakerAttribution
    from nodes.core.config import LoopConfig as LoopConfig
    from nodes.core.config import Persona as Persona
    from nodes.core.env import SessionEnv as SessionEnv
    from nodes.core.policy import ModelCall as ModelCall
    from nodes.core.policy import Reply as Reply
    from nodes.core.policy import Round as Round
    from nodes.core.policy import RoundPolicy as RoundPolicy
    from nodes.core.protocols import Hearing as Hearing
    from nodes.core.protocols import ReplyJudge as ReplyJudge
    from nodes.core.protocols import ReplyVerdict as ReplyVerdict
    from nodes.core.state import LoopState as LoopState
    from nodes.core.state import TurnInput as TurnInput
    from nodes.extraction.background import JobStats as JobStats
    from nodes.extraction.background import extraction_stats as extraction_stats
    from nodes.extraction.background import wait_for_extractions as wait_for_extractions
    from nodes.extraction.extractors import LLMExtractor as LLMExtractor
    from nodes.extraction.extractors import ManualExtractor as ManualExtractor
    from nodes.extraction.ledger import ExtractionLedger as ExtractionLedger
    from nodes.extraction.ledger import ProvidesExtractionLedger as ProvidesExtractionLedger
    from nodes.guards.policy import Guard as Guard
    from nodes.guards.policy import KeywordGuard as KeywordGuard
    from nodes.presence.judges import LLMReplyJudge as LLMReplyJudge
    from nodes.presence.judges import ReplyScorer as ReplyScorer
    from nodes.tools.hooks import AuditEvent as AuditEvent
    from nodes.tools.hooks import ToolHooks as ToolHooks

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AuditEvent": "nodes.tools.hooks",
        "CapacityEvent": "nodes.capacity.policy",
        "CapacityPolicy": "nodes.capacity.policy",
        "GracefulStop": "graph.shutdown",
        "Guard": "nodes.guards.policy",
        "Hearing": "nodes.core.protocols",
        "JobStats": "nodes.extraction.background",
        "LLMExtractor": "nodes.extraction.extractors",
        "ManualExtractor": "nodes.extraction.extractors",
        "ExtractionLedger": "nodes.extraction.ledger",
        "ProvidesExtractionLedger": "nodes.extraction.ledger",
        "KeywordGuard": "nodes.guards.policy",
        "LLMReplyJudge": "nodes.presence.judges",
        "LoopConfig": "nodes.core.config",
        "LoopState": "nodes.core.state",
        "ModelCall": "nodes.core.policy",
        "Persona": "nodes.core.config",
        "PruneReport": "graph.storage.retention",
        "Reply": "nodes.core.policy",
        "ReplyJudge": "nodes.core.protocols",
        "ReplyScorer": "nodes.presence.judges",
        "ReplyVerdict": "nodes.core.protocols",
        "Round": "nodes.core.policy",
        "SpeakerAttribution": "nodes.context.speaker_attribution",
        "RoundPolicy": "nodes.core.policy",
        "SessionBusyError": "graph.sessions",
        "SessionEnv": "nodes.core.env",
        "SessionReentryError": "graph.sessions",
        "SessionWaitTimeout": "graph.sessions",
        "StopRequested": "graph.shutdown",
        "Tier": "nodes.capacity.policy",
        "ToolHooks": "nodes.tools.hooks",
        "Trusted": "nodes.boundary.admission",
        "TurnInput": "nodes.core.state",
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
    "ExtractionLedger",
    "GracefulStop",
    "Guard",
    "Hearing",
    "JobStats",
    "KeywordGuard",
    "LLMExtractor",
    "LLMReplyJudge",
    "LoopConfig",
    "LoopState",
    "ManualExtractor",
    "ModelCall",
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
    "SpeakerAttribution",
    "StopRequested",
    "Tier",
    "ToolHooks",
    "Trusted",
    "TurnInput",
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
