"""`cyrene demo`: a short scripted conversation that exercises every path offline.

An owner session with persona switch, a tool call, a remembered fact and a
photo (described offline); a group chat with a third party, a denied tool and
attribution questions, answered when it addresses 昔涟 (`GroupPresence(reply="mentioned")`:
the platform's @-mention, or her name in the text) and quiet otherwise; after
each, the mood the turn-end hook gave and what compaction folded; then what
memory holds. Everything persists under the data
folder, so running it again continues the same sessions.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage

from graph import Compaction
from graph.sinks import JsonlSink
from nodes.core.state import uncovered_start
from nodes.kernel.messages import message_text

# A 4×3 PNG: two orange rows over a blue one, a sunset at the sea.
SUNSET_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAGUlEQVR42mP4P80Ijhh+VdjAEYNG1Co4AgCM5BKFUXo4wwAAAABJRU5ErkJggg=="
PHOTO = [
    {"type": "text", "text": "看看我拍的海边日落照片。"},
    {"type": "image", "base64": SUNSET_PNG, "mime_type": "image/png"},
]
OWNER_SCRIPT: tuple[tuple[str, str | list[Any]], ...] = (
    ("xilian", "早上好，昔涟。"),
    ("xilian", "现在几点了？"),
    ("xilian", "记住 我周末想去爬山"),
    ("aglaea", "阿格莱雅，刚才谁说了「查到了」？"),
    ("xilian", "今天工作好累，有点烦。"),
    ("xilian", PHOTO),
)
GROUP_SCRIPT: tuple[tuple[str | None, str, bool], ...] = (
    ("小明", "大家好！请问现在几点？", True),
    ("小明", "帮我用 take_note 记一下：明天开会", True),
    (None, "刚才谁说了「大家好」？", True),
    ("小红", "周末有人一起去爬山吗？", False),
    ("小红", "昔涟也一起来吧？", False),
)
"""(speaker, text, whether the platform flagged it as an @-mention of 昔涟): the last
two show a quiet turn, then one answered because her name is in the text."""


def _say(who: str, content: str | list[Any]) -> None:
    text = content if isinstance(content, str) else message_text(HumanMessage(content)) + "［附图］"
    print(f"  {who}：{text}")


def _stages(graph: Any, thread: str, budget: int) -> None:
    """What the turn-end hook and compaction left in the session's state."""
    state = graph.get_state({"configurable": {"thread_id": thread}}).values
    messages, summary = state["messages"], state.get("summary")
    archived = (state.get("archived") or {}).get("messages", 0)
    folded = (
        f"前 {archived + uncovered_start(messages, summary)} 条消息已折叠进摘要（其中 {archived} 条"
        f"移入存档），记录仍完整（共 {archived + len(messages)} 条）"
        if summary
        else f"{len(messages)} 条消息，未超出"
    )
    print(f"  ↳ 最近一轮的心情：{state.get('mood')}；上下文预算 {budget} token：{folded}")


def run_demo(session: Any) -> int:
    """Run the scripted conversation; returns a process exit code."""
    args, budget = session.args, session.config.feature(Compaction).max_context_tokens
    with session.graph() as graph:
        print("== 主人私聊 demo-owner ==")
        for persona, text in OWNER_SCRIPT:
            name = session.config.personas[persona].name
            _say(f"主人 → {name}", text)
            print(f"  {name}：", end="")
            session.turn(graph, text, "demo-owner", session.env("owner", persona))
        _stages(graph, "demo-owner", budget)
        print("\n== 群聊 demo-group（第三方发言带昵称，主人不带） ==")
        for name, text, mentioned in GROUP_SCRIPT:
            args.name = name
            _say(f"{name or '主人'}{'（@昔涟）' if mentioned else ''}", text)
            print(f"  {session.config.personas[session.config.default_persona].name}：", end="")
            session.turn(graph, text, "demo-group", session.env("group", None, mentioned))
        _stages(graph, "demo-group", budget)
    store = session.config.memory
    print("\n== 记忆 ==")
    for restricted in (False, True):
        hits = store.search("周末爬山", persona_id="xilian", restricted=restricted, k=3)
        where = "群聊可见" if restricted else "昔涟可见"
        print(f"  {where}：" + ("；".join(h.item.content for h in hits) or "（无）"))
    audit = JsonlSink(args.data / "audit.jsonl").read()
    print(f"\n== 审计 == {len(audit)} 条受限会话工具拒绝记录，最近一条：")
    if audit:
        last = audit[-1]
        print(
            f"  {last['actor']} 会话 {last['session_id']} 调用 {last['tool']} 被拒（{last['reason']}）"
        )
    print(
        f"\n数据保存在 {args.data}/ （checkpoints.db、memory/、audit.jsonl）；再次运行会接着同一会话。"
    )
    return 0
