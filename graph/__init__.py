"""Cyrene's agent loop as a LangGraph graph: the public API (DESIGN §7)."""

from graph.builder import build_graph
from graph.checkpoint import open_checkpointer
from memory.background import wait_for_extractions
from nodes.capacity import CapacityEvent, CapacityPolicy, Tier
from nodes.config import LoopConfig, Persona
from nodes.env import SessionEnv
from nodes.guards import Guard, KeywordGuard
from nodes.state import LoopState, TurnInput
from nodes.tool_policy import AuditEvent, ToolHooks

__all__ = [
    "AuditEvent",
    "CapacityEvent",
    "CapacityPolicy",
    "Guard",
    "KeywordGuard",
    "LoopConfig",
    "LoopState",
    "Persona",
    "SessionEnv",
    "Tier",
    "ToolHooks",
    "TurnInput",
    "build_graph",
    "open_checkpointer",
    "wait_for_extractions",
]
