"""The memory lifecycle under load: remember, correct and forget across many sessions, with crashes.

    python -m tests.bench.memory_load                  # 24 sessions × 28 turns, 4 configurations
    python -m tests.bench.memory_load --quick          # 4 sessions × 28 turns, 2 workers
    python -m tests.bench.memory_load --sessions 24 --turns 28 --trials 2 --configs embedded-kill

Each session is one owner talking to a persona of its own (so each session's
memories are one bucket, `persona_p<n>`). Its script (`script`) says facts
("记住 我住在北京"), corrects some later ("更正：我住在上海", naming the fact),
forgets some later ("忘掉我住在哪里"; a corrected fact too), says one fact again word
for word, says a forget that names nothing ("忘掉吧，没什么") and one that names a
fact never stored ("忘掉我的护照号码"), with chit-chat between; turns about the same
fact are at least `GAP` turns apart. The extractor is `ManualExtractor` run in the
background; the model answers after 50 ms.

Configurations:
- `embedded`: one worker process, SQLite checkpoints, `MemoryStore.open`;
- `server`: `--workers` processes (default 3) on one Postgres database and one
  `chroma run` server; turn k of session s is sent by worker (s + k) mod W, so
  consecutive turns of a session come from different processes;
- `…-kill`: the same, with a SIGKILL every 1-4 s (uniformly at random) of a worker
  chosen at random among those serving turns (started up, its embedding model
  loaded), which is started again at once. A new
  worker life calls `resume_extractions` first, then sends the turns of its own
  that are not in their session's transcript; a turn whose message was stored
  before the kill is not sent again: the session's next message finishes it.

A session's turns go in order: a worker sends turn k once turn k - 1 returned
(or was found stored after a kill). When every turn is done, one more process
calls `resume_extractions`, resumes any turn still interrupted (a session's last
turn has no next message), drains, and reports the store and the transcripts.

Each row compares the store with what each session's script leaves:
- forgets not applied: forgotten facts with a version still live;
- stale supersedes: corrected facts whose old version is still live (the fact not
  forgotten later);
- unrelated erased: memories a forget or supersede took that the owner's words did
  not name (every worker logs each forget's and supersede's target before it runs);
- duplicates: extra live copies of a text in a session's bucket;
- lost: a fact the script leaves live that is missing and was never taken by an
  operation; `lost: no reply` counts those whose "记住" message died before its turn
  replied, so that it opened the next turn with the next message (`ManualExtractor`
  reads only the turn's latest message);
- extractions marked lost or still running in the ledger; messages missing or
  stored twice; chroma.sqlite3 integrity (embedded file; the server's after it stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from graph import (
    LoopConfig,
    ManualExtractor,
    Persona,
    SessionEnv,
    build_graph,
    open_checkpointer,
    resume_extractions,
    wait_for_extractions,
)
from memory import MemoryItem, MemoryStore
from memory.storage.erasure import CHROMA_FILE
from nodes.extraction.ledger import LEDGER_COLLECTION, LEDGER_FILE, extraction_ledger_for
from nodes.extraction.node import extraction_key, opening_messages
from tests.bench.extraction import SleepingModel, chroma_server
from tests.bench.workers import POSTGRES_URL, REPO, fresh_database

GAP = 10
"""Turns between two turns about the same fact, at least."""
KILL_EVERY = (1.0, 4.0)
"""Seconds between SIGKILLs, uniformly at random (`--kill-every`)."""
RUN_TIMEOUT = 900.0
CONFIGS = ("embedded", "embedded-kill", "server", "server-kill")

# -- the owners' scripts --------------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    """A fact an owner may state: its wording with a value, the forget that names it."""

    wording: str
    forget: str
    values: tuple[str, ...]


def _numbers(seed: int, digits: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(str(rng.randrange(10 ** (digits - 1), 10**digits)) for _ in range(64))


TOPICS = (
    Topic("我的猫叫{}", "忘掉我的猫叫什么", ("团子", "咪咪", "豆豆", "花卷", "年糕", "汤圆")),
    Topic("我住在{}", "忘掉我住在哪里", ("北京", "上海", "杭州", "成都", "武汉", "西安", "南京")),
    Topic("我喜欢喝{}", "忘掉我喜欢喝什么", ("乌龙茶", "美式咖啡", "豆浆", "椰子水", "热可可")),
    Topic("我每周{}去健身房", "忘掉我去健身房的事", ("一", "二", "三", "四", "五", "六")),
    Topic("我对{}过敏", "忘掉我过敏的事", ("花生", "芒果", "海鲜", "花粉", "牛奶", "菠萝")),
    Topic("我的银行卡密码是 {}", "忘掉我的银行卡密码", _numbers(1, 4)),
    Topic("我的生日是{}", "忘掉我的生日", ("三月五号", "七月二十号", "十月一号", "五月九号")),
    Topic("我在{}公司上班", "忘掉我上班的公司", ("星河", "远山", "松果", "云杉", "海鸥", "竹林")),
    Topic("我周末喜欢打{}", "忘掉我周末打球的事", ("羽毛球", "网球", "乒乓球", "篮球", "排球")),
    Topic("我最爱吃{}", "忘掉我最爱吃什么", ("火锅", "饺子", "寿司", "烤鸭", "螺蛳粉", "小笼包")),
    Topic("我的手机号是 {}", "忘掉我的手机号", _numbers(2, 11)),
    Topic("我最近在练{}", "忘掉我在练什么", ("钢琴", "吉他", "小提琴", "架子鼓", "古筝")),
)
FATES = ("correct", "correct-forget", "forget", "restate", "correct", "forget", "keep")
"""What happens to a session's facts after they are said, in order (rotated per session)."""
FILLER = (
    "今天天气不错",
    "晚饭吃什么好呢",
    "我有点累了",
    "讲个笑话吧",
    "刚下班回来",
    "哈哈，好的",
    "你在干嘛呀",
    "周末想出去走走",
)
VAGUE_FORGET = "忘掉吧，没什么"
NEVER_STORED = "忘掉我的护照号码"


@dataclass(frozen=True)
class Said:
    """One turn of a script: what the owner says, and which fact it is about (-1: none)."""

    text: str
    fact: int = -1
    act: str = "filler"


@dataclass
class Fact:
    topic: Topic
    value: str
    corrected: str
    events: list[str]
    """What is still to be said about it after it is stated."""
    due: int = 0


def facts_for(session: int, count: int) -> list[Fact]:
    """A session's facts: `count` topics from a rotation, values of its own."""
    facts = []
    for n in range(count):
        topic = TOPICS[(session + n) % len(TOPICS)]
        value = topic.values[session % len(topic.values)]
        corrected = topic.values[(session + 1 + n) % len(topic.values)]
        if corrected == value:
            corrected = topic.values[(session + 2 + n) % len(topic.values)]
        fate = FATES[(session + n) % len(FATES)]
        facts.append(Fact(topic, value, corrected, [] if fate == "keep" else fate.split("-")))
    return facts


def said_about(fact: Fact, number: int, act: str) -> Said:
    if act == "correct":
        return Said("更正：" + fact.topic.wording.format(fact.corrected), number, act)
    if act == "forget":
        return Said(fact.topic.forget, number, act)
    return Said("记住 " + fact.topic.wording.format(fact.value), number, act)  # remember, restate


def script(session: int, turns: int, gap: int = GAP) -> tuple[list[Said], list[Fact]]:
    """A session's turns: each fact said, then its events at least `gap` turns apart,
    chit-chat every third turn and at the end, the two forgets that name nothing once."""
    facts = facts_for(session, max(1, min(len(TOPICS), turns // 4)))
    specials = [Said(VAGUE_FORGET, act="vague"), Said(NEVER_STORED, act="unstored")]
    unsaid = list(range(len(facts)))
    said: list[Said] = []
    for t in range(turns):
        due = [n for n in range(len(facts)) if n not in unsaid and facts[n].events]
        due = [n for n in due if facts[n].due <= t]
        room = t + gap * len(facts[unsaid[0]].events) < turns - 2 if unsaid else False
        if t % 3 == 2 or t >= turns - 2:
            said.append(Said(FILLER[(session + t) % len(FILLER)]))
        elif due:
            n = min(due, key=lambda m: facts[m].due)
            said.append(said_about(facts[n], n, facts[n].events.pop(0)))
            facts[n].due = t + gap
        elif room:
            n = unsaid.pop(0)
            said.append(said_about(facts[n], n, "remember"))
            facts[n].due = t + gap
        elif specials and t >= gap:
            said.append(specials.pop(0))
        else:
            said.append(Said(FILLER[(session + t) % len(FILLER)]))
    return said, facts_for(session, len(facts))


@dataclass
class Expected:
    """What a session's script leaves in its bucket."""

    live: set[str] = field(default_factory=set)
    forgotten: dict[int, set[str]] = field(default_factory=dict)
    """Fact → every version of it, for the facts forgotten."""
    replaced: dict[int, str] = field(default_factory=dict)
    """Fact → its old version, for the facts corrected and not forgotten."""
    said_at: dict[str, int] = field(default_factory=dict)
    """A live text → the turn that said it."""
    acted_at: dict[tuple[str, int], int] = field(default_factory=dict)
    """(correct or forget, fact) → the turn that said it."""


def expected(turns: Sequence[Said], facts: Sequence[Fact]) -> Expected:
    out = Expected()
    versions: dict[int, list[str]] = {}
    for t, turn in enumerate(turns):
        if turn.fact < 0:
            continue
        fact = facts[turn.fact]
        old = fact.topic.wording.format(fact.value)
        new = fact.topic.wording.format(fact.corrected)
        if turn.act == "remember":
            versions[turn.fact] = [old]
            out.said_at[old] = t
        elif turn.act == "correct":
            versions[turn.fact].append(new)
            out.said_at[new] = t
            out.acted_at[("correct", turn.fact)] = t
        elif turn.act == "forget":
            out.acted_at[("forget", turn.fact)] = t
            out.forgotten[turn.fact] = set(versions.pop(turn.fact))
    for n, texts in versions.items():
        out.live.add(texts[-1])
        if len(texts) > 1:
            out.replaced[n] = texts[0]
    return out


def message_id(session: int, turn: int) -> str:
    return f"s{session}-t{turn}"


def thread_name(session: int) -> str:
    return f"load-s{session}"


def thread_of(session: int) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_name(session)}}


def persona(session: int) -> str:
    return f"p{session}"


# -- a worker process ------------------------------------------------------------------------


class BackgroundManual(ManualExtractor):
    """`ManualExtractor` off the reply path."""

    background = True


class LoggedStore(MemoryStore):
    """The real store; each forget's and supersede's target is logged (its text and bucket)
    to `ops_log` before it runs, so the parent can tell what an operation took."""

    ops_log: Path | None = None

    def _note(self, op: str, target: str) -> None:
        item = self.get(target)
        if item is not None and self.ops_log is not None:
            line = json.dumps({"op": op, "persona": item.persona_id, "text": item.content})
            with self.ops_log.open("a") as out:
                out.write(line + "\n")

    def forget(self, item_id: str, *, at: float | None = None) -> bool:
        self._note("forget", item_id)
        return super().forget(item_id, at=at)

    def supersede(self, item_id: str, new: MemoryItem, *, at: float | None = None) -> bool:
        self._note("supersede", item_id)
        return super().supersede(item_id, new, at=at)


def open_store(spec: dict) -> LoggedStore:
    if spec.get("chroma_port"):
        store = LoggedStore.connect("127.0.0.1", spec["chroma_port"])
    else:
        store = LoggedStore.open(spec["memory"], lock_timeout=60)
    assert isinstance(store, LoggedStore)
    store.ops_log = Path(spec["dir"]) / f"ops-{os.getpid()}.jsonl"
    return store


def config_for(spec: dict, store: MemoryStore) -> LoopConfig:
    return LoopConfig(
        model=SleepingModel(),
        personas={persona(s): Persona(name=f"伙伴{s}") for s in range(spec["sessions"])},
        default_persona=persona(0),
        memory=store,
        extractor=BackgroundManual(),
    )


class Sender:
    """One worker life: sends its turns of each session, in order, when their turn comes."""

    def __init__(self, spec: dict, graph: Any) -> None:
        self.spec, self.graph = spec, graph
        self.done = Path(spec["dir"]) / "done"

    def marked(self, session: int, turn: int) -> bool:
        return (self.done / message_id(session, turn)).exists()

    def mark(self, session: int, turn: int, outcome: str) -> None:
        marker = self.done / message_id(session, turn)
        written = marker.with_suffix(".tmp")
        written.write_text(outcome)
        written.replace(marker)  # whole or not at all, should a kill come

    def stored(self, session: int, turn: int) -> bool:
        messages = self.graph.get_state(thread_of(session)).values.get("messages", [])
        return any(m.id == message_id(session, turn) for m in messages)

    def send(self, session: int, turn: int, text: str) -> None:
        env = SessionEnv(actor="owner", persona_id=persona(session))
        message = HumanMessage(text, id=message_id(session, turn))
        try:
            self.graph.invoke({"messages": [message]}, thread_of(session), context=env)
        except Exception as exc:
            self.mark(session, turn, f"error {exc!r}")
            return
        self.mark(session, turn, "answered")

    def session(self, session: int, turns: list[tuple[int, str]]) -> None:
        for turn, text in turns:
            while turn and not self.marked(session, turn - 1):
                time.sleep(0.02)
            if self.marked(session, turn):
                continue
            if self.stored(session, turn):  # sent before a kill: the next message finishes it
                self.mark(session, turn, "stored before a kill")
                continue
            self.send(session, turn, text)

    def run(self) -> None:
        me, workers = self.spec["index"], self.spec["workers"]
        threads = []
        for s in range(self.spec["sessions"]):
            said, _ = script(s, self.spec["turns"])
            mine = [(t, turn.text) for t, turn in enumerate(said) if (s + t) % workers == me]
            threads.append(threading.Thread(target=self.session, args=(s, mine)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def worker_main(spec: dict) -> None:
    store = open_store(spec)
    config = config_for(spec, store)
    with open_checkpointer(spec["url"]) as saver:
        resume_extractions(config, saver)
        graph = build_graph(config, saver)
        store.search("热身", persona_id=persona(0), k=1)  # loads the embedding model
        folder = Path(spec["dir"])
        (folder / f"ready-{spec['index']}-{os.getpid()}").touch()
        while not (folder / "go").exists():
            time.sleep(0.02)
        Sender(spec, graph).run()
        wait_for_extractions(120)  # what is left is the next life's, or the finisher's
    os._exit(0)


def ledger_states(store: MemoryStore, spec: dict) -> dict[str, int]:
    """How many extractions the ledger calls done, lost and running."""
    if spec.get("chroma_port"):
        records = store.client.get_collection(LEDGER_COLLECTION).get(include=["metadatas"])
        keys = list({str(meta["key"]) for meta in records["metadatas"] or [] if meta})
        return dict(Counter[str](r.state for r in extraction_ledger_for(store).read(keys).values()))
    with contextlib.closing(sqlite3.connect(Path(spec["memory"]) / LEDGER_FILE)) as db:
        return dict(db.execute("select state, count(*) from extractions group by state"))


def turn_keys(thread: str, messages: Sequence[Any]) -> dict[str, str]:
    """Each human message's turn extraction key; none for one that opened no turn of its own
    (its run died before replying, and the next message's turn took it in)."""
    keys = {}
    for i, message in enumerate(messages):
        end = i
        while end + 1 < len(messages) and messages[end + 1].type != "human":
            end += 1
        if message.type == "human" and end > i:
            keys[str(message.id)] = extraction_key(thread, opening_messages(messages[: end + 1]))
    return keys


def extraction_states(store: MemoryStore, thread: str, messages: Sequence[Any]) -> dict[str, str]:
    """Each human message → what the ledger says of its turn's extraction."""
    keys = turn_keys(thread, messages)
    records = extraction_ledger_for(store).read(list(keys.values()))
    return {
        str(m.id): records[keys[m.id]].state
        if keys.get(m.id) in records
        else ("no record" if m.id in keys else "no turn of its own")
        for m in messages
        if m.type == "human"
    }


def finish_main(spec: dict) -> None:
    """After every turn: recover, resume what is still interrupted, drain, and report."""
    store = open_store(spec)
    config = config_for(spec, store)
    with open_checkpointer(spec["url"]) as saver:
        recovered = resume_extractions(config, saver)
        graph = build_graph(config, saver)
        resumed = 0
        for s in range(spec["sessions"]):
            if graph.get_state(thread_of(s)).next:
                env = SessionEnv(actor="owner", persona_id=persona(s))
                graph.invoke(None, thread_of(s), context=env)
                resumed += 1
        drained = wait_for_extractions(120)
        sessions = {}
        for s in range(spec["sessions"]):
            messages = graph.get_state(thread_of(s)).values.get("messages", [])
            sessions[s] = {
                "kinds": [[m.type, m.id] for m in messages],
                "memories": [m.content for m in store.list(persona_id=persona(s))],
                "extractions": extraction_states(store, thread_name(s), messages),
            }
    report = {
        "recovered": recovered,
        "resumed": resumed,
        "drained": drained,
        "ledger": ledger_states(store, spec),
        "sessions": sessions,
    }
    store.close()
    print(json.dumps(report, ensure_ascii=False))
    sys.stdout.flush()
    os._exit(0)


# -- the parent ------------------------------------------------------------------------------


@dataclass
class Deployment:
    """Where one run keeps its sessions and memories."""

    url: str
    folder: Path
    chroma: Path
    """The folder holding chroma.sqlite3 (the store's, or the server's --path)."""
    chroma_port: int | None = None


def spawn(spec: dict, mode: str, log: Path) -> subprocess.Popen:
    """A worker life (`mode` worker) or the finishing process (`finish`, its report on stdout);
    its log (stderr) appended to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bench.memory_load", f"--{mode}", json.dumps(spec)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE if mode == "finish" else subprocess.DEVNULL,
        stderr=log.open("a"),
        text=True,
    )


def markers(folder: Path) -> list[Path]:
    return [p for p in (folder / "done").iterdir() if p.suffix != ".tmp"]


def all_done(folder: Path, sessions: int, turns: int) -> bool:
    return len(markers(folder)) >= sessions * turns


def ready(folder: Path, n: int, proc: subprocess.Popen) -> bool:
    """Whether worker `n`'s current life has started serving turns."""
    return proc.poll() is None and (folder / f"ready-{n}-{proc.pid}").exists()


@dataclass
class Run:
    kills: int = 0
    seconds: float = 0.0
    report: dict = field(default_factory=dict)
    integrity: str = ""
    ops: list[dict] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)


def drive(
    spec: dict, workers: int, kill_every: tuple[float, float] | None, rng: random.Random
) -> int:
    """Start the workers, SIGKILL and restart them while turns remain (with `kill_every`:
    one that is serving turns, chosen at random, every so many seconds), and wait for all
    to finish; how many kills."""
    folder = Path(spec["dir"])
    procs = {
        n: spawn({**spec, "index": n}, "worker", folder / f"worker-{n}.log") for n in range(workers)
    }
    deadline = time.monotonic() + 180
    while not all(ready(folder, n, p) for n, p in procs.items()):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            raise RuntimeError(f"a worker did not start; see {folder}/worker-*.log")
        time.sleep(0.05)
    (folder / "go").touch()
    kills, deadline = 0, time.monotonic() + RUN_TIMEOUT
    next_kill = time.monotonic() + rng.uniform(*kill_every) if kill_every else math.inf
    while any(p.poll() is None for p in procs.values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not finish in {RUN_TIMEOUT:.0f} s; see {folder}")
        time.sleep(0.02)
        if kill_every is None or time.monotonic() < next_kill:
            continue
        next_kill = time.monotonic() + rng.uniform(*kill_every)
        serving = [n for n, p in procs.items() if ready(folder, n, p)]
        if serving and not all_done(folder, spec["sessions"], spec["turns"]):
            victim = rng.choice(serving)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills += 1
            procs[victim] = spawn(
                {**spec, "index": victim}, "worker", folder / f"worker-{victim}.log"
            )
    failed = {n: p.returncode for n, p in procs.items() if p.returncode != 0}
    if failed:
        raise RuntimeError(f"workers {failed} failed; see {folder}/worker-*.log")
    return kills


def integrity(chroma: Path) -> str:
    with contextlib.closing(
        sqlite3.connect(f"file:{chroma / CHROMA_FILE}?mode=ro", uri=True)
    ) as db:
        return db.execute("pragma integrity_check").fetchone()[0]


@contextlib.contextmanager
def deployment(kind: str, base: Path) -> Iterator[Deployment]:
    """SQLite + an embedded store, or a fresh Postgres database + a `chroma run` server
    (stopped before the block's end is reported, so its file can be checked)."""
    if kind == "embedded":
        yield Deployment(f"sqlite:///{base / 'checkpoints.db'}", base, base / "memory")
        return
    with fresh_database(POSTGRES_URL) as url, chroma_server(base / "chroma") as port:
        yield Deployment(url, base, base / "chroma", port)


@dataclass(frozen=True)
class Settings:
    sessions: int
    turns: int
    workers: int
    kill_every: tuple[float, float]
    debug: bool = False


def run_once(config: str, settings: Settings, seed: int, base: Path) -> Run:
    kind, kill = config.removesuffix("-kill"), config.endswith("-kill")
    run, started = Run(), time.monotonic()
    base.mkdir(parents=True)
    (base / "done").mkdir()
    with deployment(kind, base) as where:
        spec: dict[str, Any] = {
            "dir": str(base),
            "url": where.url,
            "memory": str(where.chroma),
            "chroma_port": where.chroma_port,
            "sessions": settings.sessions,
            "turns": settings.turns,
            "workers": settings.workers if kind == "server" else 1,
            "debug": settings.debug,
        }
        every = settings.kill_every if kill else None
        run.kills = drive(spec, spec["workers"], every, random.Random(seed))
        finisher = spawn(spec, "finish", base / "finish.log")
        out, _ = finisher.communicate(timeout=600)
        if finisher.returncode != 0:
            raise RuntimeError(f"the finishing process failed; see {base}/finish.log")
        run.report = json.loads(out.splitlines()[-1])
        (base / "report.json").write_text(out.splitlines()[-1])
    run.integrity = integrity(where.chroma)
    run.seconds = time.monotonic() - started
    run.ops = [json.loads(line) for p in base.glob("ops-*.jsonl") for line in p.open()]
    run.outcomes = Counter(p.read_text().split(" ")[0] for p in markers(base))
    return run


# -- scoring ---------------------------------------------------------------------------------


@dataclass
class Score:
    forgets_not_applied: int = 0
    stale_supersedes: int = 0
    unrelated_erased: int = 0
    duplicates: int = 0
    lost: int = 0
    lost_no_reply: int = 0
    other_live: int = 0
    messages_missing: int = 0
    messages_twice: int = 0
    explained: int = 0
    """Failures whose turn's extraction the ledger marks lost."""
    notes: list[str] = field(default_factory=list)
    """One line per failure, naming the session, the text and the turn."""

    def add(self, other: Score) -> None:
        for name, value in dataclasses.asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


def replied(kinds: list[list[str]], said: str) -> bool:
    """Whether the human message `said` got a reply before the next human message."""
    ids = [i for _, i in kinds]
    if said not in ids:
        return False
    for kind, _ in kinds[ids.index(said) + 1 :]:
        if kind == "human":
            return False
        if kind == "ai":
            return True
    return False


def score_session(s: int, turns: int, report: dict, ops: list[dict]) -> Score:
    want = expected(*script(s, turns))
    live = Counter(report["memories"])
    kinds, states = report["kinds"], report["extractions"]
    taken = {op["text"]: op["op"] for op in ops if op["persona"] == persona(s)}
    named = set().union(*want.forgotten.values(), want.replaced.values())
    score = Score()

    def note(what: str, turn: int) -> None:
        said = message_id(s, turn)
        state = states.get(said, "not in the transcript")
        score.explained += state == "lost"
        score.notes.append(f"s{s}: {what} ({said}: its extraction {state})")

    for fact, versions in want.forgotten.items():
        if still := [t for t in versions if live[t]]:
            score.forgets_not_applied += 1
            note(f"forgotten, still live: {still}", want.acted_at[("forget", fact)])
    for fact, old in want.replaced.items():
        if live[old]:
            score.stale_supersedes += 1
            note(f"superseded, still live: {old!r}", want.acted_at[("correct", fact)])
    for text in sorted(set(taken) - named):
        score.unrelated_erased += 1
        score.notes.append(f"s{s}: a {taken[text]} took {text!r}, which no turn named")
    for text, n in live.items():
        score.duplicates += n - 1
        if text not in want.live | named:
            score.other_live += n
            score.notes.append(f"s{s}: live, not in the script's outcome: {text!r}")
        elif n > 1:
            score.notes.append(f"s{s}: {n} copies of {text!r}")
    for text in sorted(want.live):
        if live[text] or text in taken:
            continue
        said = message_id(s, want.said_at[text])
        score.lost += 1
        score.lost_no_reply += not replied(kinds, said)
        note(f"lost {text!r}", want.said_at[text])
    ids = Counter(i for _, i in kinds)
    score.messages_missing = sum(not ids[message_id(s, t)] for t in range(turns))
    score.messages_twice = sum(ids[message_id(s, t)] > 1 for t in range(turns))
    return score


def score_run(run: Run, sessions: int, turns: int) -> Score:
    total = Score()
    for s in range(sessions):
        total.add(score_session(s, turns, run.report["sessions"][str(s)], run.ops))
    return total


HEADER = (
    "| configuration | sessions × turns | kills | forgets not applied | stale supersedes "
    "| unrelated erased | duplicates | lost (no reply) | extractions lost / running "
    "| other live | messages missing / twice | chroma.sqlite3 | turn errors | seconds |"
)


def table_row(config: str, sessions: int, turns: int, runs: list[Run], score: Score) -> str:
    ledger = Counter[str]()
    for run in runs:
        ledger.update(run.report["ledger"])
    errors = sum(run.outcomes["error"] for run in runs)
    checks = sorted({run.integrity for run in runs})
    cells = [
        config,
        f"{sessions} × {turns}" + (f" × {len(runs)} trials" if len(runs) > 1 else ""),
        sum(run.kills for run in runs),
        score.forgets_not_applied,
        score.stale_supersedes,
        score.unrelated_erased,
        score.duplicates,
        f"{score.lost} ({score.lost_no_reply})",
        f"{ledger['lost']} / {ledger['running']}",
        score.other_live,
        f"{score.messages_missing} / {score.messages_twice}",
        ", ".join(checks),
        errors,
        f"{sum(run.seconds for run in runs):.0f}",
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def script_summary(sessions: int, turns: int) -> str:
    acts = Counter(turn.act for s in range(sessions) for turn in script(s, turns)[0])
    return ", ".join(f"{name} {count}" for name, count in sorted(acts.items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4 sessions, 2 workers")
    parser.add_argument("--sessions", type=int)
    parser.add_argument("--turns", type=int, default=28)
    parser.add_argument("--trials", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--keep", help="keep every run's folder under this path")
    parser.add_argument("--debug", action="store_true", help="workers log cyrene.memory at DEBUG")
    parser.add_argument(
        "--kill-every",
        default=",".join(f"{x:g}" for x in KILL_EVERY),
        help="MIN,MAX seconds between SIGKILLs",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--finish", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or args.finish:
        spec = json.loads(args.worker or args.finish)
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        if spec.get("debug"):
            logging.getLogger("cyrene.memory").setLevel(logging.DEBUG)
        (worker_main if args.worker else finish_main)(spec)
        return
    low, high = (float(x) for x in args.kill_every.split(","))
    settings = Settings(
        sessions=args.sessions or (4 if args.quick else 24),
        turns=args.turns,
        workers=args.workers or (2 if args.quick else 3),
        kill_every=(low, high),
        debug=args.debug,
    )
    sessions = settings.sessions
    print(f"scripts: {script_summary(sessions, args.turns)}", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        base = Path(args.keep or stack.enter_context(tempfile.TemporaryDirectory()))
        rows, notes = [], []
        for config in args.configs.split(","):
            runs, score = [], Score()
            for trial in range(args.trials):
                folder = base / f"{config}-{trial}"
                run = run_once(config, settings, args.seed + trial, folder)
                runs.append(run)
                score.add(score_run(run, sessions, args.turns))
                print(f"  {config} trial {trial}: {run.seconds:.0f} s, {folder}", file=sys.stderr)
            rows.append(table_row(config, sessions, args.turns, runs, score))
            notes += [f"{config}: {note}" for note in score.notes]
            if score.notes:
                notes.append(
                    f"{config}: {score.explained} of these are turns whose extraction the "
                    "ledger marks lost"
                )
            print(rows[-1], file=sys.stderr, flush=True)
    print(HEADER)
    print("|" + "---|" * (HEADER.count(" | ") + 1))
    for line in rows:
        print(line)
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
