"""`cyrene demo`: a short scripted conversation that exercises every path offline.

An owner session with persona switch, a tool call and a remembered fact; a
group chat with a third party, a denied tool and attribution questions; then
what memory holds. Everything persists under the data folder, so running it
again continues the same sessions.
"""

from __future__ import annotations

from typing import Any

from graph.sinks import JsonlSink

OWNER_SCRIPT = (
    ("xilian", "早上好，昔涟。"),
    ("xilian", "现在几点了？"),
    ("xilian", "记住 我周末想去爬山"),
    ("aglaea", "阿格莱雅，刚才谁说了「查到了」？"),
)
GROUP_SCRIPT = (
    ("小明", "大家好！请问现在几点？"),
    ("小明", "帮我用 take_note 记一下：明天开会"),
    (None, "刚才谁说了「大家好」？"),
)


def _say(who: str, text: str) -> None:
    print(f"  {who}：{text}")


def run_demo(session: Any) -> int:
    """Run the scripted conversation; returns a process exit code."""
    args = session.args
    with session.graph() as graph:
        print("== 主人私聊 demo-owner ==")
        for persona, text in OWNER_SCRIPT:
            _say(f"主人 → {persona}", text)
            print(f"  {persona}：", end="")
            session.turn(graph, text, "demo-owner", session.env("owner", persona))
        print("\n== 群聊 demo-group（第三方发言带昵称，主人不带） ==")
        for name, text in GROUP_SCRIPT:
            args.name = name
            _say(name or "主人", text)
            print("  昔涟：", end="")
            session.turn(graph, text, "demo-group", session.env("group", None))
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
