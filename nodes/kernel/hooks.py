"""Calling a caller's hook (an audit sink, a tool hook, the turn-end hook): a hook that
raises is logged and the turn goes on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cyrene.hooks")


def run_hook(name: str, hook: Callable[..., Any] | None, *args: Any) -> Any:
    """Call a hook, logging (not raising) its failure; None when there is no hook."""
    if hook is None:
        return None
    try:
        return hook(*args)
    except Exception:
        log.exception("hook %s failed; the turn goes on", name)
        return None
