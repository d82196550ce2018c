"""Token counts and prompt caching, computed the way the two providers bill them.

Approximations (tiktoken cannot fetch its vocabularies here, and neither
provider publishes its tokenizer for Claude):

- a token is a CJK character, or up to 4 other characters (OpenAI's rule of
  thumb: about 4 characters of English a token), counted over the request's
  JSON as sent, so keys and punctuation cost tokens as the real template's do;
- caches never expire: a chat that pauses for longer than a provider keeps an
  entry (OpenAI: minutes; Anthropic: 5 minutes after its last use) is not
  modelled, and the emulator's clock is the wall clock, not `LoopConfig.clock`;
- no per-message template overhead, no image tokens.

Caching:

- OpenAI (platform.openai.com/docs/guides/prompt-caching): automatic, for
  prompts of at least 1,024 tokens; a request reads the longest prefix it shares
  with an earlier request to the same model, in 128-token steps from 1,024. The
  prompt is the tool definitions, then the messages, each as JSON, in order.
- Anthropic (docs.anthropic.com/en/docs/build-with-claude/prompt-caching): only
  up to a `cache_control` breakpoint, in the order tools, system, messages. A
  breakpoint whose prefix reaches the model's minimum (1,024 tokens; 2,048 for
  the Claude 3 Haiku models; 4,096 for Haiku 4.5) writes an entry; a request
  reads the longest entry that ends at one of the ~20 block boundaries up to
  each of its breakpoints (the same look-back as `tests/cache_share.py`).
  `input_tokens` then counts only what is neither read nor written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from tests.cache_share import ANTHROPIC_LOOKBACK

CJK = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
PIECE = re.compile(f"[{CJK}]|[^{CJK}]{{1,4}}")
OPENAI_MINIMUM = 1024
OPENAI_STEP = 128


def pieces(text: str) -> list[str]:
    """`text` cut into the pieces that stand for its tokens."""
    return PIECE.findall(text)


def count(text: str) -> int:
    """How many tokens `text` is estimated to be."""
    return len(pieces(text))


def serialized(value: Any) -> str:
    """The canonical JSON text tokens are counted over (key order does not matter)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def prefix_digests(units: Sequence[str]) -> list[bytes]:
    """The digest of every prefix: `digests[i]` covers `units[: i + 1]`."""
    running, digests = hashlib.sha256(), []
    for unit in units:
        running.update(unit.encode() + b"\x00")  # the separator keeps unit boundaries apart
        digests.append(running.copy().digest())
    return digests


@dataclass
class PrefixCache:
    """OpenAI's automatic prefix cache: every 128-token prefix each model has seen."""

    seen: dict[str, set[bytes]] = field(default_factory=lambda: defaultdict(set))

    def read(self, model: str, prompt: str) -> tuple[int, int]:
        """(prompt tokens, cached tokens) for a prompt; the prompt is then cached too."""
        tokens = pieces(prompt)
        blocks = ["".join(tokens[i : i + OPENAI_STEP]) for i in range(0, len(tokens), OPENAI_STEP)]
        whole = len(tokens) // OPENAI_STEP  # only whole 128-token blocks are cached
        digests = prefix_digests(blocks)[:whole]
        known = self.seen[model]
        hits = next((i for i, d in enumerate(digests) if d not in known), len(digests))
        known.update(digests)
        cached = hits * OPENAI_STEP
        return len(tokens), cached if cached >= OPENAI_MINIMUM else 0


@dataclass(frozen=True)
class CacheUse:
    """What an Anthropic request read from the cache, wrote to it, and paid in full."""

    read: int
    written: int
    uncached: int


@dataclass
class BreakpointCache:
    """Anthropic's cache: the prefixes written at breakpoints, per model."""

    entries: dict[str, set[bytes]] = field(default_factory=lambda: defaultdict(set))

    def use(self, model: str, units: Sequence[str], marks: Sequence[int], minimum: int) -> CacheUse:
        """Read the longest entry a breakpoint reaches, write every breakpoint's prefix that
        is long enough, and say how the request's tokens split."""
        ends = list(accumulate(count(unit) for unit in units))
        digests = prefix_digests(units)
        known = self.entries[model]
        hit = max((self._hit(mark, digests, known) for mark in marks), default=-1)
        read = ends[hit] if hit >= 0 else 0
        writes = [mark for mark in marks if ends[mark] >= minimum]
        known.update(digests[mark] for mark in writes)
        last = max(writes, default=-1)
        written = ends[last] - read if last > hit else 0
        total = ends[-1] if ends else 0
        return CacheUse(read=read, written=written, uncached=total - read - written)

    @staticmethod
    def _hit(mark: int, digests: Sequence[bytes], known: set[bytes]) -> int:
        """The last unit of the longest known prefix at most `ANTHROPIC_LOOKBACK` blocks
        before `mark`, or -1."""
        lowest = max(mark - ANTHROPIC_LOOKBACK, 0)
        return next((end for end in range(mark, lowest - 1, -1) if digests[end] in known), -1)
