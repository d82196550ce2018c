"""`CyreneGraph`, the compiled loop, and what its runs are made of.

A run's steps are cut by phase: opening it (`graph.runs.opening`: admitted, bound to
what its thread was opened as), deciding what runs once the session is held
(`graph.runs.claims`), and the class that orders those steps and runs the turn
(`graph.runs.compiled`); the session's facts on its trace are `graph.runs.traces`.
"""

from graph.runs.claims import (
    ANSWERED,
    MESSAGES,
    NothingToResumeError,
    final_reply,
    recovered_input,
)
from graph.runs.compiled import CyreneGraph
from graph.runs.traces import TraceFacts

__all__ = [
    "ANSWERED",
    "MESSAGES",
    "CyreneGraph",
    "NothingToResumeError",
    "TraceFacts",
    "final_reply",
    "recovered_input",
]
