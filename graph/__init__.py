"""Cyrene's agent loop as a LangGraph graph: the public API (DESIGN §7)."""

from graph.builder import build_graph
from graph.capacity import CapacityEvent, CapacityPolicy, Tier
from graph.checkpoint import open_checkpointer
from graph.config import LoopConfig, Persona
from graph.env import SessionEnv
from graph.state import LoopState, TurnInput
from memory.background import wait_for_extractions
from nodes.guards import Guard, KeywordGuard
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
