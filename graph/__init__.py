"""Cyrene's agent loop as a LangGraph graph: the public API (DESIGN §7).

Every name is imported on first use (`memory.lazy`), so a reader of one
submodule (`cyrene history`) does not load the whole loop.
"""

from typing import TYPE_CHECKING

from memory.lazy import lazy_exports

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
    from memory.background import JobStats as JobStats
    from memory.background import extraction_stats as extraction_stats
    from memory.background import wait_for_extractions as wait_for_extractions
    from nodes.boundary import Trusted as Trusted
    from nodes.config import LoopConfig as LoopConfig
    from nodes.config import Persona as Persona
    from nodes.env import SessionEnv as SessionEnv
    from nodes.policies.base import ModelRequest as ModelRequest
    from nodes.policies.base import Reply as Reply
    from nodes.policies.base import Round as Round
    from nodes.policies.base import RoundPolicy as RoundPolicy
    from nodes.policies.capacity import CapacityEvent as CapacityEvent
    from nodes.policies.capacity import CapacityPolicy as CapacityPolicy
    from nodes.policies.capacity import Tier as Tier
    from nodes.policies.guards import Guard as Guard
    from nodes.policies.guards import KeywordGuard as KeywordGuard
    from nodes.policies.reply_judges import LLMReplyJudge as LLMReplyJudge
    from nodes.policies.reply_judges import ReplyScorer as ReplyScorer
    from nodes.policies.tool_calls import AuditEvent as AuditEvent
    from nodes.policies.tool_calls import ToolHooks as ToolHooks
    from nodes.protocols import Hearing as Hearing
    from nodes.protocols import ReplyJudge as ReplyJudge
    from nodes.protocols import ReplyVerdict as ReplyVerdict
    from nodes.state import LoopState as LoopState
    from nodes.state import TurnInput as TurnInput

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AuditEvent": "nodes.policies.tool_calls",
        "CapacityEvent": "nodes.policies.capacity",
        "CapacityPolicy": "nodes.policies.capacity",
        "GracefulStop": "graph.shutdown",
        "Guard": "nodes.policies.guards",
        "Hearing": "nodes.protocols",
        "JobStats": "memory.background",
        "KeywordGuard": "nodes.policies.guards",
        "LLMReplyJudge": "nodes.policies.reply_judges",
        "LoopConfig": "nodes.config",
        "LoopState": "nodes.state",
        "ModelRequest": "nodes.policies.base",
        "Persona": "nodes.config",
        "PruneReport": "graph.storage.retention",
        "Reply": "nodes.policies.base",
        "ReplyJudge": "nodes.protocols",
        "ReplyScorer": "nodes.policies.reply_judges",
        "ReplyVerdict": "nodes.protocols",
        "Round": "nodes.policies.base",
        "RoundPolicy": "nodes.policies.base",
        "SessionBusyError": "graph.sessions",
        "SessionEnv": "nodes.env",
        "SessionReentryError": "graph.sessions",
        "SessionWaitTimeout": "graph.sessions",
        "StopRequested": "graph.shutdown",
        "Tier": "nodes.policies.capacity",
        "ToolHooks": "nodes.policies.tool_calls",
        "Trusted": "nodes.boundary",
        "TurnInput": "nodes.state",
        "aresume_extractions": "graph.extractions",
        "arun_turn": "graph.shutdown",
        "build_graph": "graph.builder",
        "extraction_stats": "memory.background",
        "open_checkpointer": "graph.storage.checkpoint",
        "prune_checkpoints": "graph.storage.retention",
        "resume_extractions": "graph.extractions",
        "run_turn": "graph.shutdown",
        "wait_for_extractions": "memory.background",
    },
)
__all__ = [
    "AuditEvent",
    "CapacityEvent",
    "CapacityPolicy",
    "GracefulStop",
    "Guard",
    "Hearing",
    "JobStats",
    "KeywordGuard",
    "LLMReplyJudge",
    "LoopConfig",
    "LoopState",
    "ModelRequest",
    "Persona",
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
