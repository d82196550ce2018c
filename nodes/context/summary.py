"""How the view shows the compactor's summary: one system message whose lines are data."""

from __future__ import annotations

from langchain_core.messages import SystemMessage

from nodes.context.encoding import INDEX_LOOKALIKE
from nodes.core.state import Summary
from nodes.kernel.text import marker_proof

SUMMARY_PREFIX = "对话摘要（更早的对话已压缩，按发言人标注）：\n"


def summary_message(summary: Summary | None) -> SystemMessage | None:
    """The summary as system text: whoever wrote it (a compactor quoting participants, a
    model, `update_state`), none of its lines can pass for one of the loop's markers or
    for a line of the leading message's indexes (such a line is marked with "· ")."""
    if not summary or not summary["text"]:  # nothing left to show (`nodes.compaction.rewrite`)
        return None
    return SystemMessage(SUMMARY_PREFIX + INDEX_LOOKALIKE.sub("· ", marker_proof(summary["text"])))
