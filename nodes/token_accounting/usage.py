"""Token usage as data: counts a checkpoint can store, whatever a provider reports.

A provider or a proxy may report usage as floats, NaN, `None` values or integers past
2^63; stored, such a value fails the checkpoint (`Integer exceeds 64-bit range`) or
every later sum (`add_usage`: `Unknown value types`). A count is kept only when it is
a non-negative integer within 64 bits; anything else is left out and logged once per
kind, and sums stop at the largest count. Light on imports: `cyrene history` reads
stored totals through it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from langchain_core.messages.ai import UsageMetadata, add_usage

log = logging.getLogger("cyrene.tokens")
MAX_COUNT = 2**63 - 1
"""The largest count a checkpoint stores (a signed 64-bit integer)."""
COUNTS = ("input_tokens", "output_tokens", "total_tokens")
_DETAILS = ("input_token_details", "output_token_details")
_reported: set[str] = set()
"""The kinds of odd usage already logged in this process (each once)."""


def _odd(where: str, value: Any) -> None:
    kind = f"{where}: {type(value).__name__}"
    if kind not in _reported:
        _reported.add(kind)
        log.warning("ignoring token usage %s = %r (not a count of tokens)", where, value)


def count_of(value: Any) -> int | None:
    """`value` as a token count: a non-negative int within 64 bits, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _counts(raw: Mapping[Any, Any], where: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in raw.items():
        if isinstance(key, str) and (count := count_of(value)) is not None:
            counts[key] = count
        else:
            _odd(f"{where}.{key}", value)
    return counts


def clean_usage(usage: Any) -> UsageMetadata | None:
    """The counts of a usage report that are token counts (see the module); None when it
    holds none. Unknown keys are dropped: `add_usage` sums only what it knows."""
    if not isinstance(usage, Mapping) or not usage:
        if usage:
            _odd("usage_metadata", usage)
        return None
    clean: dict[str, Any] = _counts({k: usage[k] for k in COUNTS if k in usage}, "usage")
    for key in _DETAILS:
        details = usage.get(key)
        if isinstance(details, Mapping) and (counts := _counts(details, key)):
            clean[key] = counts
        elif details is not None and not isinstance(details, Mapping):
            _odd(key, details)
    if not clean:
        return None
    for key in COUNTS:
        clean.setdefault(key, 0)
    return cast(UsageMetadata, clean)


def _capped(usage: Mapping[str, Any]) -> UsageMetadata:
    """`usage` with every count held at `MAX_COUNT` (a sum past it is not storable)."""
    return cast(
        UsageMetadata,
        {k: _capped(v) if isinstance(v, Mapping) else min(v, MAX_COUNT) for k, v in usage.items()},
    )


def summed(left: UsageMetadata | None, right: UsageMetadata | None) -> UsageMetadata:
    """`add_usage`, held within what a checkpoint stores."""
    return _capped(add_usage(left, right))


def storable(value: Any) -> Any:
    """`value` with every integer no checkpoint can store (past 64 bits) replaced by None:
    a provider's raw usage in a reply's `response_metadata` is stored with the reply."""
    if isinstance(value, bool) or not isinstance(value, int | Mapping | list | tuple):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else None
    if isinstance(value, Mapping):
        return {key: storable(item) for key, item in value.items()}
    return [storable(item) for item in value]
