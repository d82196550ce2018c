"""Cyrene's agent loop as a LangGraph graph: the public API (DESIGN §7)."""

from graph.builder import build_graph
from graph.extractions import aresume_extractions, resume_extractions
from graph.sessions import SessionBusyError, SessionReentryError, SessionWaitTimeout
from graph.shutdown import GracefulStop, StopRequested, arun_turn, run_turn
from graph.storage.checkpoint import open_checkpointer
from graph.storage.retention import PruneReport, prune_checkpoints
from memory.background import JobStats, extraction_stats, wait_for_extractions
from nodes.boundary import Trusted
from nodes.config import LoopConfig, Persona
from nodes.env import SessionEnv
from nodes.policies.base import ModelRequest, Reply, Round, RoundPolicy
from nodes.policies.capacity import CapacityEvent, CapacityPolicy, Tier
from nodes.policies.guards import Guard, KeywordGuard
from nodes.policies.reply_judges import LLMReplyJudge, ReplyScorer
from nodes.policies.tool_calls import AuditEvent, ToolHooks
from nodes.protocols import Hearing, ReplyJudge, ReplyVerdict
from nodes.state import LoopState, TurnInput

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
