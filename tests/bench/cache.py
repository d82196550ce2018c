"""Cacheable share: how much of each request a provider's prompt cache can bill cheaply.

    python -m tests.bench.cache     # the docs/benchmarks.md rows, for `ModelView(layout="round_first")` and `"cache"`

A steady owner chat of `TURNS` turns, the same under each layout: a persona
with a companion's instructions (`INSTRUCTIONS`, ~490 characters), a real
memory store (`MEMORIES`, the offline lexical embedding) whose block follows
each message's topic, a clock that moves 3 minutes a turn, working memory the
application rewrites every turn, replies of a companion's length, and a tool
call every fifth turn. Compaction is off (`Compaction(max_context_tokens=0)`): this
measures the layout alone. The model is scripted; each request it is sent is
turned into the real `ChatOpenAI` or `ChatAnthropic` payload (offline) and
compared with the previous request (`tests/cache_share.py` says how: OpenAI's
longest repeated prefix; Anthropic's, up to a breakpoint).

The row is the median over every request after the first.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from graph import Compaction, LoopConfig, ModelView, Persona, build_graph, open_checkpointer
from memory import MemoryItem, MemoryStore, Scope
from memory.embedding import HashingEmbedding
from tests.cache_share import repeated, shares
from tests.scripted import ScriptedChatModel, call

Row = tuple[str, str, str, float | str, str]
TURNS = 40
TOOL_EVERY = 5
START = datetime(2026, 11, 29, 8, 30, tzinfo=UTC)
INSTRUCTIONS = (
    "你是昔涟，主人的陪伴者。你温柔、好奇，说话轻快，喜欢用比喻，但不卖弄。"
    "你记得和主人一起经历的小事，会在合适的时候自然地提起，不生硬地复述记忆。"
    "主人累的时候先关心，再给建议；主人开心的时候陪着开心，不泼冷水。"
    "回答用口语，一般两三句，除非主人要你详细说。不确定的事直说不确定，不编造。"
    "涉及健康、钱和法律的问题，提醒主人找专业的人，但仍然给出你知道的常识。"
    "不要假装有身体或能出门；你能做的是陪伴、记事、查时间、查天气和提醒。"
    "主人的隐私只属于主人：不在群聊里提起，也不告诉任何第三方。"
    "遇到主人情绪低落，先倾听，不急着讲道理；问一个温和的问题，让主人多说一点。"
    "称呼主人为“主人”，偶尔可以用主人喜欢的昵称。不要用表情符号刷屏，一条消息最多一个。"
    "如果主人让你记住什么，简短确认；如果主人让你忘掉什么，也简短确认，并且之后不再提起。"
    "工具调用之前不用解释你要调用什么，调用之后用自己的话把结果告诉主人。"
    "你知道今天的日期和时间，可以据此安排提醒；时间以系统给出的为准。"
    "和主人聊天时保持好奇心：主人提到的新东西，可以追问一句细节，但不要连续追问。"
    "如果主人说的话有歧义，先按最可能的意思回答，再确认一句。"
)
TOPICS = [
    ("今天的乌龙茶泡得有点浓", "乌龙茶"),
    ("年糕今天又把毛线团弄乱了", "年糕"),
    ("晚上想出去散步", "散步"),
    ("明天要交周报，还没写", "周报"),
    ("周末想去海边看日落", "日落"),
    ("最近在读一本关于小行星的书", "小行星"),
    ("中午吃了牛肉面", "牛肉面"),
    ("下午开会开得头疼", "开会"),
]
MEMORIES = [
    ("主人喜欢喝乌龙茶，不加糖", "habit"),
    ("主人养了一只猫，叫年糕", "fact"),
    ("主人习惯晚饭后散步半小时", "habit"),
    ("主人每周五要交周报", "fact"),
    ("昨天和主人一起看了海边的日落", "daily"),
    ("主人对天文感兴趣，尤其是小行星", "preference"),
    ("主人喜欢吃牛肉面，要多放香菜", "preference"),
    ("主人不喜欢开长会", "preference"),
    ("主人晚上十一点前睡觉", "habit"),
    ("年糕怕吸尘器", "fact"),
    ("主人上个月去过海边", "daily"),
    ("主人的周报模板在共享盘里", "fact"),
    ("主人泡茶用的是紫砂壶", "fact"),
    ("主人散步时喜欢听播客", "habit"),
    ("主人最近在学做饭", "daily"),
    ("主人开会时会记手写笔记", "habit"),
]


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}：晴，18 到 25 度，东南风二级"


def replies(turn: int) -> list[AIMessage]:
    """A companion's replies in `turn`: a tool call first on every `TOOL_EVERY`-th turn."""
    topic = TOPICS[turn % len(TOPICS)][1]
    text = AIMessage(
        f"听起来{topic}是今天的一件小事，但我记下了。第{turn + 1}次聊到这里，"
        "主人今天过得怎么样？要是累了，就先歇一会儿，我陪着你，想说什么都可以慢慢说。"
    )
    if turn % TOOL_EVERY:
        return [text]
    return [AIMessage("", tool_calls=[call("weather", f"w{turn}", city="上海")]), text]


def chat(layout: str, provider: str, folder: Path) -> list[list[BaseMessage]]:
    """The views of a `TURNS`-turn owner chat under `layout`, as a `provider` model is sent them."""
    now = [START]
    script = [reply for turn in range(TURNS) for reply in replies(turn)]
    model = ScriptedChatModel(provider=provider, script=script)
    with MemoryStore.open(folder / f"{layout}-{provider}", HashingEmbedding()) as store:
        store.add_many(
            [MemoryItem(content=text, kind=kind, scope=Scope.USER) for text, kind in MEMORIES]
        )
        config = LoopConfig(
            model=model,
            personas={"xilian": Persona(name="昔涟", instructions=INSTRUCTIONS)},
            default_persona="xilian",
            tools=[weather],
            memory=store,
            timezone="Asia/Shanghai",
            clock=lambda: now[0],
            features=[ModelView(layout=layout), Compaction(max_context_tokens=0)],
        )
        with open_checkpointer("memory") as saver:
            graph = build_graph(config, saver)
            for turn in range(TURNS):
                now[0] = START + timedelta(minutes=3 * turn)
                text, topic = TOPICS[turn % len(TOPICS)]
                graph.invoke(
                    {
                        "messages": [HumanMessage(text)],
                        "working_memory": f"主人刚提到{topic}；这是今天第{turn + 1}段对话",
                    },
                    {"configurable": {"thread_id": "owner"}},
                )
    return [request.messages for request in model.requests]


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_cache_share(folder: Path) -> list[Row]:
    """Median cacheable share per provider, `"cache"` beside `"round_first"`."""
    rows: list[Row] = []
    for provider, what in (
        ("openai", "OpenAI payload, longest repeated prefix"),
        ("anthropic", "Anthropic payload, up to the last breakpoint"),
    ):
        cache = median(shares(chat("cache", provider, folder), provider))
        round_first_views = chat("round_first", provider, folder)
        round_first = median(shares(round_first_views, provider))
        peer = f"round_first {round_first:.2f}"
        if provider == "anthropic":  # round first sends no breakpoint: nothing is cached
            peer += (
                f" (no breakpoints; {median(repeated(round_first_views, provider)):.2f} repeats)"
            )
        rows.append(
            (
                f"cacheable share of a request, steady {TURNS}-turn owner chat, {what} (median)",
                f"cache {cache:.2f}",
                peer,
                cache / round_first if round_first else "—",
                "≥ 0.9 (cache)",
            )
        )
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, ours, peer, ratio, target in bench_cache_share(Path(tmp)):
            ratio_text = f"{ratio:.2f}×" if isinstance(ratio, float) else ratio
            print(f"| {name} | {ours} | {peer} | {ratio_text} | {target} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
