"""`cyrene`: talk to the loop from a terminal; everything persists under `--data`.

cyrene demo                         the offline demo conversation (the main job)
cyrene run "你好" --session s1       one turn, reply printed (streamed)
cyrene chat --persona aglaea        interactive; /persona ID, /actor owner|group|stranger, /quit
cyrene chat --actor group --name 小明 --group-reply mentioned   a group that is answered when it names her
cyrene resume s1                    finish a turn a crash, a failure or a signal interrupted
cyrene history s1                   the session's transcript, with speakers and token totals
cyrene memory add|search|list|forget|import|export|reindex
cyrene prune --keep 20              delete all but each session's last 20 checkpoints
cyrene studio                       LangGraph Studio on this folder (offline flags)

Options such as --data and --session go before or after the command.
Exit codes: 0 ok, 1 nothing to resume or not found, 2 bad input or an expected
failure, 75 the turn failed but is saved (resume it), 130/143 stopped by
SIGINT/SIGTERM at a step boundary (resume it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from graph.builder import build_graph
from graph.shutdown import GracefulStop, StopRequested
from graph.storage.retention import DEFAULT_KEEP, prune_checkpoints
from memory.transcript import message_text
from nodes.config import GroupReply, LoopConfig
from nodes.env import Actor
from nodes.view.sanitize import check_id
from studio.cli_memory import add_memory_parser, memory_command
from studio.cli_session import EXTRACTION_TIMEOUT, Session, thread_config
from studio.cli_storage import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    checkpoint_url,
    checkpointer,
    data_folder,
    reading_checkpointer,
)
from studio.cli_text import one_line, visible
from studio.demo_model import DemoChatModel

ACTORS: tuple[str, ...] = get_args(Actor)
GROUP_REPLIES: tuple[str, ...] = get_args(GroupReply)
SIGINT_EXIT = 130
TURN_COMMANDS = ("demo", "run", "chat", "resume")


def _options(parser: argparse.ArgumentParser, names: tuple[str, ...], top: bool) -> None:
    """The shared options; a subcommand's copies default to SUPPRESS so that they
    never overwrite a value given before the subcommand."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    specs: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
        "data": (
            ("--data",),
            {"type": Path, "default": default(Path(".cyrene")), "help": "data folder (./.cyrene)"},
        ),
        "checkpoint": (
            ("--checkpoint",),
            {"default": default(None), "help": "checkpoint URL (sqlite:///DATA/checkpoints.db)"},
        ),
        "model": (
            ("--model",),
            {"default": default(None), "help": "provider:model, e.g. openai:gpt-4o-mini"},
        ),
        "session": (("--session",), {"default": default("default"), "help": "session id"}),
        "persona": (("--persona",), {"default": default(None), "help": "persona to answer as"}),
        "actor": (("--actor",), {"default": default("owner"), "choices": ACTORS}),
        "name": (("--name",), {"default": default(None), "help": "third-party display name"}),
        "group_reply": (
            ("--group-reply",),
            {
                "default": default(None),
                "choices": GROUP_REPLIES,
                "help": "which group turns are answered (always; mentioned: the persona's "
                "name or a nickname in the text; judged: the offline scorer)",
            },
        ),
    }
    for name in names:
        flags, kwargs = specs[name]
        parser.add_argument(*flags, **kwargs)


ALL = ("data", "checkpoint", "model", "session", "persona", "actor", "name", "group_reply")
TURN = ("data", "checkpoint", "model", "persona", "actor", "name")
MEMORY = ("data", "persona")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cyrene", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _options(top, ALL, top=True)
    sub = top.add_subparsers(dest="command", required=True)

    def command(name: str, options: tuple[str, ...], **kwargs: Any) -> argparse.ArgumentParser:
        made = sub.add_parser(name, **kwargs)
        _options(made, options, top=False)
        return made

    demo = command(
        "demo", ("data", "checkpoint", "model"), help="run the offline demo conversation"
    )
    demo.set_defaults(group_reply="mentioned")  # its group chat shows a quiet turn
    command("chat", ALL, help="interactive chat")
    command("run", ALL, help="one turn").add_argument("text")
    command("resume", TURN, help="finish an interrupted turn").add_argument("session_id")
    command("history", ("data", "checkpoint"), help="a session's transcript").add_argument(
        "session_id"
    )
    prune = command(
        "prune", ("data", "checkpoint"), help="delete old checkpoints, keep transcripts"
    )
    prune.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help="checkpoints kept per session"
    )
    prune.add_argument("sessions", nargs="*", help="sessions to prune (default: all)")
    studio = command("studio", ("data", "group_reply"), help="serve the graph in LangGraph Studio")
    studio.add_argument("--port", type=int, default=2024)
    memory = command("memory", MEMORY, help="manage long-term memory")
    add_memory_parser(memory, lambda action: _options(action, MEMORY, top=False))
    return top


def main(argv: list[str] | None = None, *, model: BaseChatModel | None = None) -> int:
    """Run one `cyrene` command; returns its exit code.

    Args:
        argv: the arguments (default `sys.argv[1:]`).
        model: a chat model to use instead of `--model` / $CYRENE_MODEL (for embedding, tests).
    """
    args = parser().parse_args(argv)
    try:
        if args.command in TURN_COMMANDS:
            return turn_command(args, model)
        return dispatch(args)
    except CliError as exc:
        print(f"cyrene: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a bad value caught by a validator: a message, not a traceback
        print(f"cyrene: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return SIGINT_EXIT


def turn_command(args: argparse.Namespace, model: BaseChatModel | None) -> int:
    """demo, run, chat and resume: turns under a graceful stop (README "## CLI")."""
    with GracefulStop(interrupt_idle=True) as stop:
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
        from studio.conversation import run_demo

        return run_demo(session)
    if args.command == "chat":
        return chat(session)
    with session.graph() as graph:
        if args.command == "run":
            session.turn(graph, args.text, args.session, session.env())
        else:
            session.turn(graph, None, args.session_id, session.env())
    return EXIT_OK


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "history":
        return history(args)
    if args.command == "prune":
        return prune(args)
    if args.command == "studio":
        from studio.server import serve

        return serve(data_folder(args.data, write=True), args.port, args.group_reply)
    return memory_command(args)


def speaker(message: BaseMessage) -> str:
    name = getattr(message, "name", None)
    return f"{message.type}({visible(name)})" if name else message.type


def history(args: argparse.Namespace) -> int:
    """Print a session's transcript, then its token totals when its models reported any.
    Opens only the checkpoints, read-only: no model, no memory store, so it works on a
    read-only data folder."""
    data_folder(args.data, write=False)
    check_id("session", args.session_id)
    thread = thread_config(args.session_id)
    with reading_checkpointer(checkpoint_url(args.checkpoint, args.data)) as saver:
        # The state's shape is the same for every config; this one only reads.
        graph = build_graph(LoopConfig(model=DemoChatModel()), saver)
        values = graph.get_state(thread).values
        messages = graph.transcript(thread)  # the archive and the live window
    if not messages:
        raise CliError(f"no session {args.session_id!r}", EXIT_NOT_FOUND)
    for message in messages:
        text = message_text(message) or json.dumps(
            getattr(message, "tool_calls", []), ensure_ascii=False
        )
        print(f"{speaker(message):>18}  {visible(text)}")
    if session := values.get("token_usage", {}).get("session"):
        print(f"{'tokens':>18}  {token_totals(session)}")
    return EXIT_OK


def token_totals(usage: Mapping[str, Any]) -> str:
    """`input N (cached C)  output N  total N`: the cached part only where it was reported."""
    cached = (usage.get("input_token_details") or {}).get("cache_read")
    parts = [
        f"input {usage.get('input_tokens', 0):,}"
        + (f" (cached {cached:,})" if cached is not None else ""),
        f"output {usage.get('output_tokens', 0):,}",
        f"total {usage.get('total_tokens', 0):,}",
    ]
    return "  ".join(parts)


def prune(args: argparse.Namespace) -> int:
    """Keep each session's newest `--keep` checkpoints; the transcripts stay whole."""
    data_folder(args.data, write=True)
    for session in args.sessions:
        check_id("session", session)
    url = checkpoint_url(args.checkpoint, args.data)
    with checkpointer(url) as saver:
        try:
            report = prune_checkpoints(saver, keep=args.keep, thread_ids=args.sessions or None)
        except TypeError as exc:  # a saver without tables: nothing is kept to prune
            raise CliError(f"--checkpoint {url}: {exc}") from exc
    print(report)
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
    args = session.args
    actor, persona = args.actor, args.persona
    personas = sorted(session.config.personas)
    print(f"输入消息；/persona {'|'.join(personas)}、/actor {'|'.join(ACTORS)}、/quit")
    with session.graph() as graph:
        for line in _input_lines():
            command, _, value = line.partition(" ")
            value = value.strip()
            if command == "/quit":
                break
            if command == "/persona":
                persona = _choose("persona", value, personas, persona)
            elif command == "/actor":
                actor = _choose("actor", value, ACTORS, actor) or actor
            else:
                session.turn(graph, line, args.session, session.env(actor, persona))
    return EXIT_OK


def _choose(what: str, value: str, allowed: Any, current: str | None) -> str | None:
    """`value` when it is allowed; otherwise say what is, and keep `current`."""
    if value in allowed:
        return value
    shown = f"unknown {what} {value!r}; " if value else ""  # repr escapes control characters
    print(f"{shown}choose one of: {', '.join(allowed)} (now: {current or 'default'})")
    return current


if __name__ == "__main__":
    raise SystemExit(main())
