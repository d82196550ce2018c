"""Where the uncached input tokens of `tests.emulator.cache_share`'s chats come from.

    python -m tests.emulator.cache_breakdown            # one table per cell, "cache" layout
    python -m tests.emulator.cache_breakdown -v         # and a line per steady request
    python -m tests.emulator.cache_breakdown --ceiling  # the same chats, the round's blocks dropped

Each steady request's input tokens that the provider did not read from its cache
are put in one of these kinds:

- `new`: conversation the provider has never seen (the reply before this
  request, the new message and its note, a tool call and its result);
- `round`: the round's own blocks after the conversation (who answers, time,
  working memory, memories, and with Anthropic the notes' positions);
- `repeat`: a prefix some earlier request already sent, not read all the same
  (OpenAI: the 128-token steps and the 1,024-token minimum; Anthropic: no
  breakpoint ends there);
- `compaction`: conversation after the point where the first request after a
  compaction departs from every earlier request (the lead is all it repeats).

A persona switch shows as a kind of request, not of token: under `"cache"` it changes
only the round's own blocks.

`--ceiling` replays the chats with a `ModelView.transform` that drops the round's own
blocks from every request (no time, working memory, memories or who answers): what any
placement of those blocks could reach at most, with the conversation, its compactions and
the providers' cache rules as they are.

Token counts are the emulator's (`tests.emulator.tokens`), the same that bill the share.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from langchain_core.messages import BaseMessage, SystemMessage

from nodes.context.layout import ROUND_STATE_OPEN, is_round_state
from tests.emulator.anthropic_api import units as anthropic_units
from tests.emulator.anthropic_rules import blocks_of
from tests.emulator.cache_share import GROUP, OWNER, Chat, Recording, record, split
from tests.emulator.tokens import count, prefix_digests, serialized
from tests.emulator.wire import Request

KINDS = ("new", "round", "repeat", "compaction")


@dataclass(frozen=True)
class Units:
    """A request's prompt in cache order, cut into units, with where each ends in tokens."""

    units: list[str]
    ends: list[int]
    round_from: int
    """The first unit of the round's own blocks (`len(units)` without any)."""


def openai_units(request: Request) -> Units:
    """Tool definitions, then each message, as the emulator bills them."""
    tools = [serialized(t) for t in request.payload.get("tools") or []]
    messages = request.messages
    first_round = len(messages)
    while first_round > 0 and messages[first_round - 1].get("role") == "system":
        first_round -= 1
    units = tools + [serialized(m) for m in messages]
    joined = list(accumulate(units))
    return Units(units, [count(text) for text in joined], len(tools) + first_round)


def anthropic_request_units(request: Request) -> Units:
    units, _ = anthropic_units(request.payload)
    messages = request.messages
    last = blocks_of(messages[-1].get("content")) if messages else []
    is_round = bool(last) and str(last[-1].get("text", "")).startswith(ROUND_STATE_OPEN)
    ends = list(accumulate(count(unit) for unit in units))
    return Units(units, ends, len(units) - 1 if is_round else len(units))


def breakdown(recording: Recording, chat: Chat) -> tuple[Counter[str], list[str]]:
    """Uncached tokens by kind over the steady requests (with "total" and "read"), and a
    line per steady request."""
    seen: set[bytes] = set()
    totals: Counter[str] = Counter()
    lines = []
    steady = {r.number for r in recording.steady()}
    for request in recording.requests:
        cut = (openai_units if request.provider == "openai" else anthropic_request_units)(request)
        digests = prefix_digests(cut.units)
        known = next((i for i, d in enumerate(digests) if d not in seen), len(digests))
        seen.update(digests)
        if request.number not in steady:
            continue
        read, _, total = split(request)
        turn = recording.turn_of(request)
        kind = request_kind(recording, chat, request, turn)
        repeated = cut.ends[known - 1] if known else 0
        round_start = cut.ends[cut.round_from - 1] if cut.round_from else 0
        parts = Counter(
            {
                "repeat": max(repeated - read, 0),
                "round": total - max(round_start, read),
                "compaction" if kind == "compaction" else "new": max(
                    round_start - max(repeated, read), 0
                ),
            }
        )
        totals.update(parts)
        totals.update({"total": total, "read": read})
        shown = " ".join(f"{k}={parts[k]}" for k in KINDS if parts[k])
        lines.append(
            f"  #{request.number:<3} turn {turn + 1:<2} {kind:<10} total {total:>5} "
            f"read {read:>5} ({read / total:.3f})  {shown}"
        )
    return totals, lines


def request_kind(recording: Recording, chat: Chat, request: Request, turn: int) -> str:
    """`compaction` or `switch` (the turn's first request after one), `tool` (a request
    after a tool result), else `turn`."""
    first = next(r for r in recording.requests if recording.turn_of(r) == turn)
    if request is not first:
        return "tool"
    if turn in recording.compacted_at:
        return "compaction"
    if turn and chat.persona(turn) != chat.persona(turn - 1) and len(chat.speakers) == 1:
        return "switch"
    return "turn"


def report(totals: Counter[str]) -> str:
    total = totals["total"]
    shares = " ".join(f"{k} {totals[k] / total:.3f}" for k in KINDS)
    return f"read {totals['read'] / total:.3f} | uncached: {shares} | tokens {total}"


def without_round_blocks(view: list[BaseMessage], round_: int) -> list[BaseMessage]:
    """`view` minus the round's own blocks: the round-state message (`leading`), or the
    system messages after the conversation (`inline`)."""
    if view and is_round_state(view[-1]):
        return view[:-1]
    end = len(view)
    while end and isinstance(view[end - 1], SystemMessage):
        end -= 1
    return view[:end]


def main() -> None:
    verbose = "-v" in sys.argv[1:]
    layout = "round_first" if "round_first" in sys.argv[1:] else "cache"
    transform = without_round_blocks if "--ceiling" in sys.argv[1:] else None
    with tempfile.TemporaryDirectory() as tmp:
        for provider in ("openai", "anthropic"):
            for chat in (OWNER, GROUP):
                folder = Path(tmp) / f"{provider}-{chat.name}"
                recording = record(provider, layout, chat, folder, transform=transform)
                totals, lines = breakdown(recording, chat)
                turns = ", ".join(str(t + 1) for t in recording.compacted_at) or "none"
                print(f"{provider} {layout} {chat.name} (compacted at {turns}): {report(totals)}")
                if verbose:
                    print("\n".join(lines))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
