"""`cyrene`: talk to the loop from a terminal; everything persists under `--data`.

cyrene demo                         the offline demo conversation (the main job)
cyrene run "你好" --session s1       one turn, reply printed (streamed)
cyrene chat --persona aglaea        interactive; /persona ID, /actor owner|group|stranger, /quit
cyrene resume s1                    finish a turn a crash interrupted
cyrene history s1                   the session's transcript, with speakers
cyrene memory add|search|list|forget|import|export
cyrene studio                       LangGraph Studio on this folder (offline flags)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage

from graph.builder import build_graph
from graph.checkpoint import open_checkpointer
from graph.runs import NothingToResumeError
from memory.background import wait_for_extractions
from memory.transcript import message_text
from nodes.env import SessionEnv

DEMO_NOTICE = "（使用离线演示模型 demo model：设置 --model 或 CYRENE_MODEL 以接入真实模型）"


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data", type=Path, default=Path(".cyrene"), help="data folder (default ./.cyrene)"
    )
    common.add_argument(
        "--checkpoint", help="checkpoint URL (default sqlite:///DATA/checkpoints.db)"
    )
    common.add_argument(
        "--model", help="provider:model, e.g. openai:gpt-4o-mini (or $CYRENE_MODEL)"
    )
    common.add_argument("--session", default="default", help="session (thread) id")
    common.add_argument("--persona", help="persona id to answer as")
    common.add_argument(
        "--actor", default="owner", choices=["owner", "group", "stranger", "internal"]
    )
    common.add_argument("--name", help="display name of a third-party speaker (group/stranger)")
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    top = argparse.ArgumentParser(
        prog="cyrene", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", parents=[common], help="run the offline demo conversation")
    sub.add_parser("chat", parents=[common], help="interactive chat")
    run = sub.add_parser("run", parents=[common], help="one turn")
    run.add_argument("text")
    for name in ("resume", "history"):
        sub.add_parser(name, parents=[common], help=f"{name} a session").add_argument("session_id")
    studio = sub.add_parser("studio", parents=[common], help="serve the graph in LangGraph Studio")
    studio.add_argument("--port", type=int, default=2024)
    memory = sub.add_parser("memory", help="manage long-term memory")
    msub = memory.add_subparsers(dest="action", required=True)
    add = msub.add_parser("add", parents=[common])
    add.add_argument("content")
    add.add_argument("--kind", default="note")
    add.add_argument("--scope", default="user", choices=["persona", "user", "project"])
    search = msub.add_parser("search", parents=[common])
    search.add_argument("query")
    search.add_argument("--restricted", action="store_true")
    search.add_argument("-k", type=int, default=8)
    msub.add_parser("list", parents=[common])
    forget = msub.add_parser("forget", parents=[common])
    forget.add_argument("id")
    imp = msub.add_parser("import", parents=[common])
    imp.add_argument("file", type=Path)
    msub.add_parser("export", parents=[common])
    return top


class Session:
    """A CLI session: the demo config over the data folder, a saver, and a thread."""

    def __init__(self, args: argparse.Namespace) -> None:
        from studio.demo import demo_config, demo_model

        self.args = args
        model, is_demo = demo_model(args.model)
        if is_demo:
            print(DEMO_NOTICE, file=sys.stderr)
        self.config = demo_config(args.data, model=model)
        self.url = args.checkpoint or f"sqlite:///{args.data / 'checkpoints.db'}"

    @contextlib.contextmanager
    def graph(self) -> Iterator[Any]:
        with open_checkpointer(self.url) as saver:
            yield build_graph(self.config, saver)

    def env(self, actor: str | None = None, persona: str | None = None) -> SessionEnv:
        return SessionEnv(actor=actor or self.args.actor, persona_id=persona or self.args.persona)

    def turn(self, graph: Any, text: str | None, thread: str, env: SessionEnv) -> str:
        """Run (or resume, when text is None) one turn, streaming the reply; returns it."""
        message = None
        if text is not None:
            name = self.args.name if env.restricted else None
            message = {
                "messages": [HumanMessage(text, name=name, id=f"cli-{uuid.uuid4().hex[:12]}")]
            }
        config = {"configurable": {"thread_id": thread}}
        streamed = False
        for chunk, meta in graph.stream(message, config, context=env, stream_mode="messages"):
            if isinstance(chunk, AIMessageChunk) and meta.get("langgraph_node") == "call_model":
                piece = message_text(chunk)
                if piece:
                    print(piece, end="", flush=True)
                    streamed = True
        if streamed:
            print()
        final = graph.get_state(config).values["messages"][-1]
        if not streamed:
            print(message_text(final))
        wait_for_extractions(timeout=65)
        return message_text(final)


def speaker(message: BaseMessage) -> str:
    name = getattr(message, "name", None)
    return f"{message.type}({name})" if name else message.type


def show_history(graph: Any, thread: str) -> None:
    state = graph.get_state({"configurable": {"thread_id": thread}})
    for message in state.values.get("messages", []):
        text = message_text(message) or json.dumps(
            getattr(message, "tool_calls", []), ensure_ascii=False
        )
        print(f"{speaker(message):>18}  {text}")


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


def chat(session: Session) -> None:
    actor, persona = session.args.actor, session.args.persona
    print("输入消息；/persona ID、/actor owner|group|stranger、/quit")
    with session.graph() as graph:
        for line in _input_lines():
            if line == "/quit":
                break
            if line.startswith("/persona "):
                persona = line.split(maxsplit=1)[1]
                continue
            if line.startswith("/actor "):
                actor = line.split(maxsplit=1)[1]
                continue
            session.turn(graph, line, session.args.session, session.env(actor, persona))


def memory_command(args: argparse.Namespace) -> int:
    from memory import MemoryItem, MemoryStore, Scope

    store = MemoryStore.open(args.data / "memory")
    if args.action == "add":
        persona = args.persona if args.scope == "persona" else None
        print(
            store.add(
                MemoryItem(
                    content=args.content,
                    kind=args.kind,
                    scope=Scope(args.scope),
                    persona_id=persona,
                )
            )
        )
    elif args.action == "search":
        for hit in store.search(
            args.query, persona_id=args.persona, restricted=args.restricted, k=args.k
        ):
            print(
                f"{hit.score:.3f}  [{hit.item.kind}] {hit.item.content}  ({hit.item.bucket}, {hit.item.id})"
            )
    elif args.action in ("list", "export"):
        for item in store.list():
            print(
                item.model_dump_json()
                if args.action == "export"
                else f"{item.id}  {item.bucket:<16} [{item.kind}] {item.content}"
            )
    elif args.action == "forget":
        if not store.forget(args.id):
            print(f"no memory with id {args.id}", file=sys.stderr)
            return 1
    elif args.action == "import":
        return import_memories(store, args.file)
    return 0


def import_memories(store: Any, path: Path) -> int:
    """Import a JSON-lines file of memory items in batches, with a progress bar."""
    from memory import MemoryItem

    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    items = []
    for number, line in enumerate(lines, 1):
        try:
            items.append(MemoryItem.model_validate_json(line))
        except ValueError as exc:
            print(f"{path}:{number}: {exc}", file=sys.stderr)
            return 1
    batch = 500
    for start in range(0, len(items), batch):
        store.add_many(items[start : start + batch])
        done = min(start + batch, len(items))
        bar = "#" * (30 * done // max(len(items), 1))
        print(f"\r[{bar:<30}] {done}/{len(items)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"imported {len(items)} memories")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return dispatch(args)
    except ValueError as exc:  # bad input at the boundary: a message, not a traceback
        print(f"cyrene: {exc}", file=sys.stderr)
        return 2


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "memory":
        return memory_command(args)
    if args.command == "studio":
        from studio.server import serve

        return serve(args.data, args.port)
    session = Session(args)
    if args.command == "demo":
        from studio.conversation import run_demo

        return run_demo(session)
    if args.command == "chat":
        chat(session)
        return 0
    with session.graph() as graph:
        if args.command == "run":
            session.turn(graph, args.text, args.session, session.env())
        elif args.command == "resume":
            try:
                session.turn(graph, None, args.session_id, session.env())
            except NothingToResumeError as exc:
                print(exc, file=sys.stderr)
                return 1
        elif args.command == "history":
            show_history(graph, args.session_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
