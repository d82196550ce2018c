"""The commands that read or tidy stored sessions: `history`, `sessions`, `prune`, `graph`.

`history` and `sessions` open only the checkpoints, read-only, and read them
without the loop (`graph.storage.reading`): no model, no memory store, no
graph machinery, so they answer in a fraction of a second and work on a
read-only data folder.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from langchain_core.messages import BaseMessage

from graph.storage.reading import StoredSession, read_session, stored_sessions
from nodes.kernel.messages import message_text
from nodes.kernel.sanitize import check_id
from studio.cli.errors import EXIT_NOT_FOUND, EXIT_OK, CliError
from studio.cli.storage import checkpoint_url, checkpointer, reading, stored_data, writable_data
from studio.text import visible


def speaker(message: BaseMessage) -> str:
    name = getattr(message, "name", None)
    return f"{message.type}({visible(name)})" if name else message.type


def history(args: argparse.Namespace) -> int:
    """Print a session's transcript (or its `--last N` messages), then its token totals when
    its models reported any."""
    check_id("session", args.session_id)
    with reading(args) as (saver, archive):
        session = read_session(saver, args.session_id)
        messages = session.transcript(archive, args.last) if session else []
    if session is None or not messages:
        raise CliError(f"no session {args.session_id!r}", EXIT_NOT_FOUND)
    for message in messages:
        text = message_text(message) or json.dumps(
            getattr(message, "tool_calls", []), ensure_ascii=False
        )
        print(f"{speaker(message):>18}  {visible(text)}")
    if session.token_usage:
        print(f"{'tokens':>18}  {token_totals(session.token_usage)}")
        for purpose, usage in session.token_purposes.items():
            print(f"{purpose:>18}  {token_totals(usage)}")
    return EXIT_OK


def sessions(args: argparse.Namespace) -> int:
    """One line per session, the most recently active first."""
    with reading(args) as (saver, _):
        found = stored_sessions(saver)
    for session in found:
        print(session_line(session))
    return EXIT_OK


def session_line(session: StoredSession) -> str:
    """`id  last activity  N messages  tokens…` (tokens where a provider reported any)."""
    when = datetime.fromisoformat(session.updated).strftime("%Y-%m-%d %H:%M UTC")
    usage = f"  {token_totals(session.token_usage)}" if session.token_usage else ""
    return f"{visible(session.thread_id)}  {when}  {session.message_count} messages{usage}"


CACHE_WRITES = ("cache_creation", "ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
"""Where LangChain puts the input tokens written to a cache: `cache_creation`, or, when the
API breaks them down by lifetime (Anthropic's does), the two ephemeral counts, with
`cache_creation` 0."""


def token_totals(usage: Mapping[str, Any]) -> str:
    """`input N (cached C, cache writes W)  output N  total N`: the cache reads and writes
    only where a provider reported them (Anthropic bills writes at 1.25×)."""
    details = usage.get("input_token_details") or {}
    written = [details[key] for key in CACHE_WRITES if details.get(key) is not None]
    cache = [
        *([f"cached {details['cache_read']:,}"] if details.get("cache_read") is not None else []),
        *([f"cache writes {sum(written):,}"] if written else []),
    ]
    parts = [
        f"input {usage.get('input_tokens', 0):,}" + (f" ({', '.join(cache)})" if cache else ""),
        f"output {usage.get('output_tokens', 0):,}",
        f"total {usage.get('total_tokens', 0):,}",
    ]
    return "  ".join(parts)


def prune(args: argparse.Namespace) -> int:
    """Keep each session's newest `--keep` checkpoints; the transcripts stay whole. A named
    session that does not exist is an error, as for `history`."""
    from graph.storage.retention import prune_checkpoints

    for session in args.sessions:
        check_id("session", session)
    stored_data(args)
    writable_data(args)
    url = checkpoint_url(args)
    with checkpointer(url) as saver:
        for session in args.sessions:
            if read_session(saver, session) is None:
                raise CliError(f"no session {session!r}", EXIT_NOT_FOUND)
        try:
            report = prune_checkpoints(saver, keep=args.keep, thread_ids=args.sessions or None)
        except TypeError as exc:  # a saver without tables: nothing is kept to prune
            raise CliError(f"--checkpoint {url}: {exc}") from exc
    print(report)
    return EXIT_OK


def graph(args: argparse.Namespace) -> int:
    """Print the loop's graph as Mermaid: every stage switched on (the README's drawing)."""
    print(loop_drawing())
    return EXIT_OK


def loop_drawing() -> str:
    """The Mermaid drawing of the loop with every stage on; the README holds the same."""
    from graph import Compaction, LoopConfig, Vision, build_graph
    from studio.demo.model import DemoChatModel

    features = [Vision(describer=lambda block: ""), Compaction(max_context_tokens=8000)]
    config = LoopConfig(model=DemoChatModel(), features=features)
    return build_graph(config).get_graph().draw_mermaid().strip()
