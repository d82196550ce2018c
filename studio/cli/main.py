"""`cyrene`: talk to the loop from a terminal; everything persists under `--data`.

cyrene demo                         the offline demo conversation (the main job)
cyrene run "你好" --session s1       one turn, reply printed (streamed)
cyrene chat --persona aglaea        interactive; /help lists its commands
cyrene chat --actor group --name 小明 --group-reply mentioned   a group that is answered when it names her
cyrene resume s1                    finish a turn a crash, a failure or a signal interrupted
cyrene sessions                     every session: last activity, messages, tokens
cyrene history s1                   the session's transcript, with speakers and token totals
cyrene graph                        the loop's graph as a Mermaid diagram
cyrene memory add|search|list|forget|import|export|reindex
cyrene prune --keep 20              delete all but each session's last 20 checkpoints
cyrene studio                       LangGraph Studio on this folder, beside the CLI

Options such as --data and --session go before or after the command; each
environment variable in brackets sets an option's default.
Exit codes: 0 ok, 1 not found (a session, a memory, the data folder, nothing
to resume), 2 bad input or an expected failure, 75 the turn failed but is
saved (resume it), 130/143 stopped by SIGINT/SIGTERM at a step boundary
(resume it).

This module imports only the standard library: `cyrene --help` and usage
errors answer at once, and each command loads what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from nodes.kernel.choices import ACTORS
from nodes.presence.choices import GROUP_REPLIES
from studio import settings
from studio.cli.errors import EXIT_OK, EXIT_USAGE, CliError, describe

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

SIGINT_EXIT = 130
TURN_COMMANDS = ("demo", "run", "chat", "resume")
DEFAULT_KEEP = 20  # graph.storage.DEFAULT_KEEP (tests/test_cli.py checks they agree)
ENV = {
    "data": settings.DATA_ENV,
    "checkpoint": settings.CHECKPOINT_ENV,
    "model": settings.MODEL_ENV,
    "memory_server": settings.MEMORY_SERVER_ENV,
    "group_reply": settings.GROUP_REPLY_ENV,
}
"""Option → the environment variable that sets its default (docs/extras-and-environment.md "Environment variables")."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one `cyrene: …` line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"cyrene: {message} (`{self.prog} --help` lists the options)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def positive(text: str) -> int:
    """A count of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a whole number from 1")
    return int(text)


def port(text: str) -> int:
    """A TCP port number, 1–65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: a number from 1 to 65535")
    return value


OPTIONS: dict[str, dict[str, Any]] = {
    "data": {
        "type": Path,
        "help": "data folder: checkpoints.db, memory/, audit.jsonl (default ./.cyrene)",
    },
    "checkpoint": {
        "metavar": "URL",
        "help": "checkpoint URL: memory, sqlite:///relative.db, sqlite:////abs.db or "
        "postgresql://… (default sqlite:///DATA/checkpoints.db)",
    },
    "model": {
        "metavar": "PROVIDER:MODEL",
        "help": "chat model, e.g. openai:gpt-4o-mini (default: the offline demo model)",
    },
    "memory_server": {
        "metavar": "HOST:PORT",
        "help": "a Chroma server (`chroma run`) holding the memories (default: the one "
        "`cyrene studio` runs for DATA, else DATA/memory embedded)",
    },
    "session": {"default": "default", "help": "session (thread) id"},
    "persona": {"help": "persona to answer as: xilian (default) or aglaea"},
    "actor": {
        "choices": ACTORS,
        "help": "who is talking (a new session: owner by default; a session is always what "
        "it was opened as)",
    },
    "name": {"help": "the speaker's display name in a group or stranger chat"},
    "group_reply": {
        "choices": GROUP_REPLIES,
        "help": "which group turns are answered: always; mentioned (her name or a nickname "
        "in the text); judged (the offline scorer)",
    },
}
"""The shared options (`--group-reply` for `group_reply`), without their environment."""


def _option(name: str, top: bool, helps: Mapping[str, str]) -> dict[str, Any]:
    """`name`'s argparse settings: the default its environment variable sets now (shown in
    its help), or SUPPRESS in a subcommand's copy, so that it never overwrites a value
    given before the subcommand; `helps` replaces the help text where a command means
    something else by the option."""
    spec = {**OPTIONS[name], **({"help": helps[name]} if name in helps else {})}
    variable = ENV.get(name)
    default = (variable and os.environ.get(variable)) or spec.get("default")
    if variable:
        spec["help"] = f"{spec['help']} [{variable}]"
    if name == "data":
        default = Path(default or settings.DEFAULT_DATA)
    return {**spec, "default": default if top else argparse.SUPPRESS}


def add_options(
    parser: argparse.ArgumentParser,
    names: tuple[str, ...],
    top: bool,
    helps: Mapping[str, str] | None = None,
) -> None:
    """The shared options, on the top parser (`top`) or a subcommand's."""
    for name in names:
        parser.add_argument(f"--{name.replace('_', '-')}", **_option(name, top, helps or {}))


STORES = ("data", "checkpoint")
TURN = (*STORES, "model", "memory_server", "persona", "actor", "name", "group_reply")
ALL = (*TURN, "session")
MEMORY = ("data", "memory_server", "persona")
MEMORY_HELPS = {
    "persona": "the persona a `--scope persona` memory belongs to (required there); `search` "
    "shows what that persona's turns see (without it: the shared memories only)"
}
"""What `--persona` means to `cyrene memory`, which has no persona by default."""


def parser() -> Parser:
    top = Parser(prog="cyrene", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_options(top, ALL, top=True)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, options: tuple[str, ...], help: str) -> argparse.ArgumentParser:
        made = sub.add_parser(name, help=help, description=help)
        add_options(made, options, top=False)
        return made

    demo = command("demo", (*STORES, "model", "memory_server"), "run the offline demo")
    demo.set_defaults(group_reply="mentioned")  # its group chat shows a quiet turn
    command("chat", ALL, "interactive chat; /help lists its commands")
    command("run", ALL, "one turn, the reply printed").add_argument("text", help="the message")
    command("resume", TURN, "finish an interrupted turn").add_argument(
        "session_id", help="the session whose turn to finish"
    )
    history = command("history", STORES, "a session's transcript and token totals")
    history.add_argument("session_id", help="the session to show")
    history.add_argument(
        "--last", type=positive, metavar="N", help="only its last N messages (a long session)"
    )
    command("sessions", STORES, "every session: last activity, messages, tokens")
    command("graph", (), "print the loop's graph as a Mermaid diagram")
    prune = command("prune", STORES, "delete old checkpoints; transcripts stay whole")
    prune.add_argument(
        "--keep",
        type=positive,
        default=DEFAULT_KEEP,
        help=f"checkpoints kept per session ({DEFAULT_KEEP})",
    )
    prune.add_argument("sessions", nargs="*", help="sessions to prune (default: all)")
    studio = command(
        "studio", ("data", "checkpoint", "model", "group_reply"), "LangGraph Studio on DATA"
    )
    studio.add_argument("--port", type=port, default=2024, help="the API's port (2024)")
    from studio.cli.memory import add_memory_parser  # argparse and pathlib only

    memory = sub.add_parser(
        "memory", help="manage long-term memory", description="manage long-term memory"
    )
    add_options(memory, MEMORY, top=False, helps=MEMORY_HELPS)
    add_memory_parser(memory, lambda action: add_options(action, MEMORY, False, MEMORY_HELPS))
    return top


def check_choices(top: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An option with choices whose value came from its environment variable (argparse checks
    only what the command line gives) is a usage error naming both."""
    for name, spec in OPTIONS.items():
        value = getattr(args, name, None)
        if "choices" in spec and value is not None and value not in spec["choices"]:
            variable = f" [{ENV[name]}]" if name in ENV else ""
            choices = ", ".join(spec["choices"])
            top.error(f"--{name.replace('_', '-')}{variable}: {value!r} is not one of {choices}")


def main(argv: list[str] | None = None, *, model: BaseChatModel | None = None) -> int:
    """Run one `cyrene` command; returns its exit code.

    Args:
        argv: the arguments (default `sys.argv[1:]`).
        model: a chat model to use instead of `--model` / $CYRENE_MODEL (for embedding, tests).
    """
    try:
        top = parser()
        args = top.parse_args(argv)
        check_choices(top, args)
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0)
    try:
        code = _command(args.command)(args, model)
        sys.stdout.flush()  # here, so that a reader gone early is caught below
        return code
    except BrokenPipeError:  # `cyrene sessions | head`: the reader has what it wanted
        _discard_stdout()
        return EXIT_OK
    except CliError as exc:
        print(f"cyrene: {describe(exc)}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a bad value caught by a validator: a message, not a traceback
        print(f"cyrene: {describe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return SIGINT_EXIT


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush into the closed
    pipe does not print a traceback of its own."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


Command = Callable[[argparse.Namespace, "BaseChatModel | None"], int]


def _command(name: str) -> Command:
    """The command's function, from the module that holds it (imported only now)."""
    if name in TURN_COMMANDS:
        from studio.cli.turns import turn_command

        return turn_command
    if name == "studio":
        from studio.cli.serve import studio_command

        return lambda args, _model: studio_command(args)
    if name == "memory":
        from studio.cli.memory import memory_command

        return lambda args, _model: memory_command(args)
    from studio.cli import read as cli_read

    return lambda args, _model: getattr(cli_read, name)(args)


if __name__ == "__main__":
    raise SystemExit(main())
