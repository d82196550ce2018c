"""Group-chat presence: who the companion answers in a busy group, and what a quiet turn costs.

    python -m tests.bench.presence            # 330 messages per policy, docs/benchmarks.md rows
    python -m tests.bench.presence --quick    # 110 messages, to check that it runs

One scripted group session of six speakers, replayed under each policy
(`always`, `mentioned`, `judged` with the offline scorer) in the demo world's
group setting (`studio.demo.world.demo_config`: restricted memory search, a
compaction budget, the image describer, capacity tiers, the turn-end hook),
to a zero-latency model, on the in-memory saver and on SQLite. About 10 % of the messages
address the persona: by name, by nickname (Chinese and Latin), with and
without an @, or only through the platform's flag (`SessionEnv(mentioned=True)`).
The rest is chatter, questions to the room, questions to another member by
name, and near misses: a member whose display name is the persona's name
(never a mention), one whose name holds a nickname (小昔昔 is not 小昔), and a
Latin nickname inside a longer word (Cyrenes, cyrene_bot).

Per policy: the share of addressed messages answered, the share of the others
answered, model calls, and process CPU per quiet turn against CPU per answered
turn in the same session (garbage collection off, collected between turns,
untimed).
"""

from __future__ import annotations

import gc
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from graph import GroupPresence, SessionEnv, build_graph, open_checkpointer
from nodes.presence.policy import quiet_reason
from studio.demo.world import demo_config
from tests.bench.table import print_bench
from tests.scripted import ScriptedChatModel

Row = tuple[str, str, str, float | str, str]
SPEAKERS = ("小明", "小红", "Lily", "阿强", "昔涟", "小昔昔")
"""Six members: 昔涟 imitates the persona's name, 小昔昔 holds the nickname 小昔."""

ADDRESSED = (
    ("{n}，你觉得呢？", False),
    ("@{n} 在吗", False),
    ("问问{n}吧", False),
    ("{n}你今天心情怎么样", False),
    ("小昔，帮我看看这个", False),
    ("哈哈小昔说得对", False),
    ("@Cyrene what do you think?", False),
    ("cyrene, are you there", False),
    ("你怎么看？", True),
    ("这个你知道吗", True),
)
"""(text, platform flag): `{n}` is the persona's name, 昔涟; 小昔 and Cyrene are its nicknames."""
QUESTIONS = (
    "有人周末去爬山吗？",
    "今天晚上吃什么呢",
    "Does anyone have the slides?",
    "这个bug谁修一下？",
    "明天几点开会？",
)
TO_MEMBERS = ("小明，你明天来吗？", "@小红 文件发我一下", "小昔昔你好呀", "Lily what time is it?")
CHATTER = (
    "哈哈哈",
    "今天天气不错",
    "我先去吃饭了",
    "刚下班，累死了",
    "这个视频好好笑",
    "+1",
    "好的好的",
    "收到",
    "I'm back",
    "Cyrenes are in Libya, right",
    "ping cyrene_bot later",
    "往事不要再提",
    "明天见～",
)


@dataclass(frozen=True)
class Line:
    speaker: str
    text: str
    flagged: bool
    addressed: bool


def script(size: int, seed: int = 22) -> list[Line]:
    """`size` messages, a tenth of them addressed, in a fixed random order."""
    rng = random.Random(seed)
    lines: list[Line] = []
    for i in range(size):
        speaker = SPEAKERS[rng.randrange(len(SPEAKERS))]
        if i % 10 == 9:
            text, flagged = ADDRESSED[(i // 10) % len(ADDRESSED)]
            lines.append(Line(speaker, text.format(n="昔涟"), flagged, True))
            continue
        pool = rng.choices((QUESTIONS, TO_MEMBERS, CHATTER), weights=(2, 1, 6))[0]
        lines.append(Line(speaker, rng.choice(pool), False, False))
    return lines


@dataclass
class Tally:
    """Messages by (addressed?, answered?), and the CPU of quiet and answered turns."""

    counts: Counter[tuple[bool, bool]] = field(default_factory=Counter)
    cpu_quiet: list[float] = field(default_factory=list)
    cpu_answered: list[float] = field(default_factory=list)


def replay(policy: str, lines: list[Line], folder: Path, url: str) -> tuple[Tally, int]:
    """Every line as one turn of one group session; returns the tally and model calls."""
    model = ScriptedChatModel(script=[AIMessage("嗯嗯。")] * (len(lines) + 1))
    config = demo_config(folder, model=model, features=[GroupPresence(reply=policy)])
    tally = Tally()
    try:
        with open_checkpointer(url) as saver:
            graph = build_graph(config, saver)
            thread = {"configurable": {"thread_id": "group"}}
            gc.disable()
            for line in lines:
                gc.collect()
                env = SessionEnv(actor="group", mentioned=line.flagged)
                message = HumanMessage(line.text, name=line.speaker)
                started = time.process_time()
                state = graph.invoke({"messages": [message]}, thread, context=env)
                spent = time.process_time() - started
                count(tally, line, quiet_reason(state) is None, spent)
    finally:
        gc.enable()
        if config.memory is not None:
            config.memory.close()
    return tally, len(model.requests)


def count(tally: Tally, line: Line, answered: bool, spent: float) -> None:
    tally.counts[line.addressed, answered] += 1
    (tally.cpu_answered if answered else tally.cpu_quiet).append(spent)


def mean_ms(samples: list[float]) -> float:
    return sum(samples) / len(samples) * 1000 if samples else float("nan")


def accuracy_row(policy: str, tally: Tally, calls: int) -> Row:
    addressed = tally.counts[True, True] + tally.counts[True, False]
    other = tally.counts[False, True] + tally.counts[False, False]
    hit, stray = tally.counts[True, True] / addressed, tally.counts[False, True] / other
    return (
        f"presence `{policy}`: answered when addressed / when not",
        f"{hit:.0%} / {stray:.0%}",
        f"{addressed} addressed, {other} not",
        f"{calls} model calls",
        TARGETS.get(policy, "reported"),
    )


def cpu_row(policy: str, saver: str, tally: Tally) -> Row:
    quiet, answered = mean_ms(tally.cpu_quiet), mean_ms(tally.cpu_answered)
    return (
        f"  `{policy}`: CPU per quiet turn, {saver} (ms)",
        f"{quiet:.2f}",
        f"answered turn {answered:.2f}",
        quiet / answered,
        "≤ 0.3×",
    )


TARGETS = {"mentioned": "100 % / 0 %", "judged": "≥ 95 % / ≤ 15 %"}
SAVERS = (("in-memory saver", "memory"), ("SQLite saver", "sqlite"))


def bench_presence(quick: bool) -> list[Row]:
    lines = script(110 if quick else 330)
    accuracy: list[Row] = []
    cpu: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("always", "mentioned", "judged"):
            for saver, scheme in SAVERS:
                folder = Path(tmp) / f"{policy}-{scheme}"
                url = "memory" if scheme == "memory" else f"sqlite:///{folder}/checkpoints.db"
                tally, calls = replay(policy, lines, folder, url)
                if scheme == "memory":
                    accuracy.append(accuracy_row(policy, tally, calls))
                if tally.cpu_quiet:
                    cpu.append(cpu_row(policy, saver, tally))
    return accuracy + cpu


def main(argv: Any = None) -> None:
    print_bench(bench_presence, argv)


if __name__ == "__main__":
    main()
