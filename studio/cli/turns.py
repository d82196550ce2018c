"""The commands that run turns: `demo`, `run`, `chat` and `resume` (docs/cli.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.language_models import BaseChatModel

from graph.shutdown import GracefulStop, StopRequested
from nodes.kernel.choices import ACTORS
from nodes.kernel.extras import missing_extra
from studio.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from studio.cli.session import EXTRACTION_TIMEOUT, Session

CHAT_HELP = (
    "输入消息发送；命令：/persona ID 换角色，/actor owner|group|stranger|internal 换身份"
    "（会话始终是开启时的身份：换身份请配 /session NAME 换会话），/session NAME 换会话，"
    "/help 显示本说明，/quit 退出（Ctrl-D 也行）"
)


OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@contextmanager
def exported_traces() -> Iterator[None]:
    """While the command runs, spans go to OTLP/HTTP when an endpoint is set (the SDK reads
    it); they are flushed before the command returns."""
    if not any(os.environ.get(name) for name in OTLP_ENDPOINTS):
        yield
        return
    try:
        from graph.tracing import enable_tracing

        provider = enable_tracing()
    except ImportError as exc:
        raise CliError(missing_extra("otel", "OTEL_EXPORTER_OTLP_ENDPOINT (tracing)")) from exc
    try:
        yield
    finally:
        provider.shutdown()


def turn_command(args: argparse.Namespace, model: BaseChatModel | None) -> int:
    """demo, run, chat and resume: turns under a graceful stop, traced when asked."""
    with exported_traces(), GracefulStop(interrupt_idle=True) as stop:
        try:
            with Session(args, stop, model) as session:
                try:
                    return run_turns(session)
                finally:
                    if stop.requested:  # background extraction gets its bounded grace
                        stop.drain(EXTRACTION_TIMEOUT)
        except StopRequested as exc:
            return exc.exit_code


def run_turns(session: Session) -> int:
    args = session.args
    if args.command == "demo":
        from studio.demo.conversation import run_demo

        return run_demo(session)
    if args.command == "chat":
        return chat(session)
    with session.graph() as graph:
        if args.command == "run":
            session.turn(graph, args.text, args.session, session.env())
        else:
            session.turn(graph, None, args.session_id, session.env())
    return EXIT_OK


def _input_lines() -> Iterator[str]:
    """Non-empty stripped lines from the terminal (with a prompt) or a pipe, until EOF."""
    prompt = "> " if sys.stdin.isatty() else ""
    while True:
        try:
            line = input(prompt).strip()
        except EOFError:
            return
        if line:
            yield line


def chat(session: Session) -> int:
    """Read lines until /quit or EOF: a command is answered here, anything else is a turn."""
    args = session.args
    actor, persona, thread = args.actor, args.persona, args.session
    personas = sorted(session.config.personas)
    print(CHAT_HELP)
    with session.graph() as graph:
        for line in _input_lines():
            command, _, value = line.partition(" ")
            value = value.strip()
            if command == "/quit":
                break
            if command == "/help":
                print(CHAT_HELP)
            elif command == "/persona":
                now = persona or session.config.default_persona or ""
                persona = _choose("persona", value, personas, persona, now)
            elif command == "/actor":
                actor = _choose("actor", value, ACTORS, actor, actor or "owner") or actor
            elif command == "/session":
                thread = _session_named(value, thread)
            elif command.startswith("/") and command[1:].isalpha():
                print(f"unknown command {command}; /help lists them")
            else:
                _refusal_said(session.turn, graph, line, thread, session.env(actor, persona))
    return EXIT_OK


def _session_named(value: str, current: str) -> str:
    """The session `/session NAME` switches to (the current one without a name)."""
    if not value:
        print(f"/session NAME switches to another session (now: {current})")
        return current
    print(f"（会话 {value}）")
    return value


def _refusal_said(turn: Callable[..., str], *args: Any) -> None:
    """A turn; one the loop refuses (bad input, a session opened as another actor) is
    said on one line and the chat goes on: nothing of it was stored."""
    try:
        turn(*args)
    except CliError as exc:
        if exc.exit_code != EXIT_USAGE:
            raise
        print(f"cyrene: {exc}", file=sys.stderr)


def _choose(
    what: str, value: str, allowed: Sequence[str], current: str | None, now: str
) -> str | None:
    """`value` when it is allowed; otherwise say what is (and what is in use: `now`),
    and keep `current`."""
    if value in allowed:
        return value
    told = f"unknown {what} {value!r}; " if value else ""  # repr escapes control characters
    print(f"{told}choose one of: {', '.join(allowed)} (now: {now})")
    return current
