"""Shared fixtures: scripted models, tools, configs, and the services tests need."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from graph import LoopConfig, Persona, SessionEnv

REQUIRE_SERVICES = os.environ.get("CYRENE_REQUIRE_SERVICES") == "1"
POSTGRES_URL = os.environ.get("CYRENE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parent.parent
FIXED_NOW = datetime(2026, 11, 29, 8, 30, tzinfo=UTC)

PERSONAS = {
    "xilian": Persona(name="昔涟", instructions="你是昔涟。"),
    "aglaea": Persona(name="阿格莱雅", instructions="你是阿格莱雅。"),
}


def service_missing(reason: str) -> None:
    """Skip when a service is absent — or fail, when CI demands every service."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


@tool
def get_time() -> str:
    """The current time."""
    return "08:30"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


def human(text: str, id: str | None = None, name: str | None = None) -> HumanMessage:
    return HumanMessage(text, id=id, name=name)


def thread(name: str) -> dict:
    return {"configurable": {"thread_id": name}}


def owner(persona: str | None = None) -> SessionEnv:
    return SessionEnv(actor="owner", persona_id=persona)


def make_config(model, **overrides) -> LoopConfig:
    base = dict(
        model=model,
        personas=PERSONAS,
        default_persona="xilian",
        tools=[get_time, add, explode],
        clock=lambda: FIXED_NOW,
    )
    base.update(overrides)
    return LoopConfig(**base)


@pytest.fixture
def postgres_url() -> str:
    """A reachable Postgres (the machine's own), or skip/fail with the reason."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute("select 1")
    except Exception as exc:
        service_missing(f"Postgres at {POSTGRES_URL} is not reachable ({exc.__class__.__name__})")
    return POSTGRES_URL


@pytest.fixture
def fresh_postgres_url(postgres_url: str) -> Iterator[str]:
    """A database of its own on the machine's Postgres, dropped afterwards.

    For tests that scan every session (recovery at start, pruning): on the
    shared `test` database they would also meet what earlier runs left."""
    import psycopg

    name = f"cyrene_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    try:
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


@contextmanager
def chroma_run(data: Path, port: int) -> Iterator[subprocess.Popen]:
    """A `chroma run` server keeping its database in `data`, on `port`, until the block ends."""
    binary = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    if not Path(binary).exists():
        service_missing("the `chroma` binary (from the chromadb wheel) is not installed")
    log = (data / "server.log").open("a")
    proc = subprocess.Popen(
        [binary, "run", "--path", str(data / "db"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )
    try:
        if not wait_for_port(port, 60, proc):
            service_missing(
                f"`chroma run` did not start: {(data / 'server.log').read_text()[-500:]}"
            )
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real `chroma run` server on a free port, for the session."""
    port = free_port()
    with chroma_run(tmp_path_factory.mktemp("chroma-server"), port):
        yield port
