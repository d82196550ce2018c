"""A CLI session: the demo world over a data folder, a saver, and turns that end cleanly.

A turn ends one of four ways, each with its own exit code (docs/cli.md):
it finishes (0); bad input is refused before anything is stored (2); it fails
after the message was stored, e.g. the model after its retries (75); or a
signal stops it at a step boundary (130/143). In the last two the session is
left resumable and the one line on stderr names `cyrene resume <session>`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import StateSnapshot

from graph.builder import build_graph
from graph.extractions import resume_extractions
from graph.runs import NothingToResumeError
from graph.sessions import SessionBusyError
from graph.shutdown import GracefulStop, StopRequested, run_turn
from memory import MemoryStore
from nodes.core.env import RESTRICTED_ACTORS, SessionEnv
from nodes.core.stages import CALL
from nodes.core.state import OPENED_AS
from nodes.kernel.messages import message_text
from nodes.kernel.provider_errors import refused_status
from nodes.kernel.sanitize import check_id
from nodes.presence.policy import quiet_reason
from nodes.presence.settings import GroupPresence
from studio.cli.errors import EXIT_NOT_FOUND, EXIT_TURN_FAILED, CliError, brief, describe
from studio.cli.storage import checkpoint_url, checkpointer, memory_errors, writable_data
from studio.text import visible

DEMO_NOTICE = "（使用离线演示模型 demo model：设置 --model 或 CYRENE_MODEL 以接入真实模型）"
EXTRACTION_TIMEOUT = 65.0  # the loop's extraction deadline (60 s) plus a margin
Content = str | list[str | dict[str, Any]]


def thread_config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def resume_command(thread: str) -> str:
    return f"cyrene resume {shlex.quote(thread)}"


def last_reply_id(messages: Sequence[BaseMessage]) -> str:
    """The id of the last finished reply."""
    for message in reversed(messages):
        if isinstance(message, AIMessage) and not message.tool_calls:
            return message.id or ""
    return ""


def anchor_id(before: StateSnapshot) -> str:
    """Where in the transcript a new message lands: after the last finished turn. A quiet
    group turn is finished too, so the same words said again are a new message; a failed
    or interrupted turn is not, so sending them again replaces the stored one."""
    messages = before.values.get("messages", [])
    if messages and not before.next:
        return messages[-1].id or ""
    return last_reply_id(messages)


def message_id(
    thread: str, env: SessionEnv, name: str | None, content: Content, anchor: str
) -> str:
    """A stable id for a CLI message: who says what, where in which session.

    Re-sending the same text after a failed turn yields the same id, so the
    stored message is replaced, not repeated; once that turn is answered the
    anchor (the last reply's id) moves on, and the same text is a new message."""
    key = json.dumps([thread, env.actor, name, anchor, content], ensure_ascii=False)
    return "cli-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class ReplyPrinter:
    """Prints the reply's tokens as they stream (from `call_model` only), escaped."""

    def __init__(self) -> None:
        self.streamed = False
        self._open_line = False

    def __call__(self, chunk: tuple[Any, dict[str, Any]]) -> None:
        message, meta = chunk
        if isinstance(message, AIMessageChunk) and meta.get("langgraph_node") == CALL:
            piece = message_text(message)
            if piece:
                print(visible(piece), end="", flush=True)
                self.streamed = self._open_line = True

    def end_line(self) -> None:
        if self._open_line:
            print()
            self._open_line = False


class Session(AbstractContextManager["Session"]):
    """The demo config over `--data`, its saver, and turns on it; close it (or use `with`)."""

    def __init__(
        self,
        args: argparse.Namespace,
        stop: GracefulStop,
        model: BaseChatModel | None = None,
    ) -> None:
        from studio.demo.world import PERSONAS, demo_config, demo_model, open_demo_store

        self.args = args
        self.stop = stop
        persona = getattr(args, "persona", None)
        if persona is not None and persona not in PERSONAS:
            choices = ", ".join(sorted(PERSONAS))
            raise CliError(f"unknown persona {persona!r}; choose one of: {choices}")
        writable_data(args)
        self.url = checkpoint_url(args)
        if model is None:
            model, is_demo = demo_model(args.model)
            if is_demo:
                print(DEMO_NOTICE, file=sys.stderr)
        reply = getattr(args, "group_reply", None)
        with memory_errors(args.data):
            store = open_demo_store(args.data, args.memory_server)
        try:
            features = [GroupPresence(reply=reply)] if reply else []
            self.config = demo_config(args.data, model=model, store=store, features=features)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        """Let go of the memory store (and its folder lock)."""
        if isinstance(self.config.memory, MemoryStore):
            self.config.memory.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def graph(self) -> Iterator[Any]:
        with checkpointer(self.url) as saver:
            resume_extractions(self.config, saver)  # what a stopped run left pending
            yield build_graph(self.config, saver)

    def env(
        self, actor: str | None = None, persona: str | None = None, mentioned: bool = False
    ) -> SessionEnv:
        """The run's context, naming only what was asked for: a session is what it was
        opened as, so an actor left unset is the session's own."""
        named = {
            "actor": actor or self.args.actor,
            "persona_id": persona or self.args.persona,
            "mentioned": mentioned or None,
        }
        return SessionEnv.model_validate({k: v for k, v in named.items() if v is not None})

    def turn(self, graph: Any, text: Content | None, thread: str, env: SessionEnv) -> str:
        """Run (or resume, when text is None) one turn, streaming the reply; returns it
        ('' for a group turn that stayed quiet: the reason is printed instead).

        `text` is a string or a list of content blocks (text, images).

        Raises:
            CliError: the input was refused, nothing to resume, the turn failed
                (resumable) or a signal stopped it (resumable).
            StopRequested: a signal came as the turn ended; it is complete.
        """
        check_id("session", thread)  # before the saver sees it: Postgres refuses a NUL itself
        config = thread_config(thread)
        before = graph.get_state(config)
        turn_input = (
            None if text is None else {"messages": [self._message(before, text, thread, env)]}
        )
        printer = ReplyPrinter()
        try:
            finished = run_turn(
                graph,
                turn_input,
                config,
                stop=self.stop,
                on_chunk=printer,
                context=env,
                stream_mode="messages",
            )
        except NothingToResumeError as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from exc
        except SessionBusyError as exc:  # refused, or waited too long: nothing was stored
            raise CliError(
                f"session {thread!r} is busy; nothing was stored, send it again later"
            ) from exc
        except Exception as exc:
            printer.end_line()
            raise _failure(exc, turn_input, before, graph.get_state(config), thread) from exc
        printer.end_line()
        if not finished:
            raise CliError(
                f"stopped; the turn is saved — `{resume_command(thread)}` finishes it",
                self.stop.exit_code,
            )
        state = graph.get_state(config).values
        quiet = quiet_reason(state)
        reply = "" if quiet is not None else message_text(state["messages"][-1])
        if quiet is not None:
            print(f"（没有回应：{visible(quiet)}）")
        elif not printer.streamed:
            print(visible(reply))
        self.stop.drain(EXTRACTION_TIMEOUT)
        if self.stop.signum is not None:  # it came during the last step: the turn is whole
            raise StopRequested(self.stop.signum)
        return reply

    def _message(
        self, before: StateSnapshot, content: Content, thread: str, env: SessionEnv
    ) -> HumanMessage:
        opened = (before.values.get(OPENED_AS) or {}).get("actor")
        actor = env.actor if "actor" in env.model_fields_set or opened is None else opened
        name = self.args.name if actor in RESTRICTED_ACTORS else None
        anchor = anchor_id(before)
        return HumanMessage(content, name=name, id=message_id(thread, env, name, content, anchor))


def _failure(
    exc: Exception,
    turn_input: dict[str, list[HumanMessage]] | None,
    before: StateSnapshot,
    after: StateSnapshot,
    thread: str,
) -> CliError:
    """What a failed turn means to the user; a bug (no saved, resumable turn) is re-raised.

    Input the boundary refuses changes nothing; a turn that fails later (the
    model after its retries, say) has stored the message and can be resumed, unless
    the provider refused the request itself (a 400: resuming would send it again)."""
    if isinstance(exc, (ValueError, TypeError)) and before.config == after.config:
        return CliError(describe(exc))
    stored = {message.id for message in after.values.get("messages", [])}
    sent = turn_input["messages"][0].id if turn_input else None
    if after.next and (sent is None or sent in stored) and refused_status(exc) is not None:
        return CliError(
            f"the provider refused the turn's request ({type(exc).__name__}: {brief(str(exc))}); "
            "sent again it would be refused again, so change what it names (the model, its "
            "key, a setting) first; your message is saved, and the session's next turn sees it"
        )
    if after.next and (sent is None or sent in stored):
        return CliError(
            f"the turn failed ({type(exc).__name__}: {brief(str(exc))}); "
            f"your message is saved — `{resume_command(thread)}` finishes the turn",
            EXIT_TURN_FAILED,
        )
    raise exc
