"""`ConversationRecall`: how much of the archived conversation a round may bring back.

On by default: a session whose compaction archived older messages (`nodes.compaction`)
gets the most relevant of them back in the memory block each round;
`ConversationRecall(max_tokens=0)` turns it off. What it does is `nodes.recall.block`.
"""

from __future__ import annotations

from pydantic import Field

from nodes.core.feature import Feature


class ConversationRecall(Feature):
    """Search the session's own archived messages every round; the best ones, dated and
    attributed, join the memory block under a heading of their own.

    Example:
        >>> LoopConfig(model=model, features=[ConversationRecall(max_tokens=300)])
    """

    max_tokens: int = Field(
        default=400,
        ge=0,
        description="tokens the recalled messages may fill (estimated: a CJK character one, four other characters one); `0` = off. Only a session whose compaction archived messages has any to recall; a group or stranger session recalls only what was said in it",
    )

    @property
    def on(self) -> bool:
        return self.max_tokens > 0
