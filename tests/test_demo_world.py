"""The demo world as `cyrene demo` and Studio run it: offline senses, budget, streamed tools."""

from __future__ import annotations

import base64
import struct
import uuid

import pytest
from langchain_core.messages import HumanMessage

from graph import Compaction, LoopConfig, Vision
from graph.builder import build_graph
from graph.storage.checkpoint import open_checkpointer
from nodes.core.env import SessionEnv
from nodes.kernel.images import ImageError
from studio.demo.conversation import OWNER_SCRIPT, SUNSET_PNG
from studio.demo.hooks import demo_mood, describe_image, image_format
from studio.demo.world import demo_config

JPEG = (
    b"\xff\xd8"
    + b"\xff\xe0"
    + struct.pack(">H", 16)
    + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    + b"\xff\xdb"
    + struct.pack(">H", 4)
    + b"\x00\x00"
    + b"\xff\xc2"  # progressive start of frame: precision, height, width
    + struct.pack(">HBHH", 11, 8, 480, 640)
)
GIF = b"GIF89a" + struct.pack("<HH", 20, 30) + b"\x00" * 8
WEBP_LOSSY = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 10 + struct.pack("<HH", 300, 200)
WEBP_LOSSLESS = (
    b"RIFF\x00\x00\x00\x00WEBPVP8L"
    + b"\x00" * 5
    + ((99) | (49 << 14)).to_bytes(4, "little")  # 100×50, stored minus one
)
WEBP_EXTENDED = (
    b"RIFF\x00\x00\x00\x00WEBPVP8X"
    + b"\x00" * 8
    + (1919).to_bytes(3, "little")
    + (1079).to_bytes(3, "little")
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (base64.b64decode(SUNSET_PNG), ("PNG", (4, 3))),
        (JPEG, ("JPEG", (640, 480))),
        (GIF, ("GIF", (20, 30))),
        (WEBP_LOSSY, ("WebP", (300, 200))),
        (WEBP_LOSSLESS, ("WebP", (100, 50))),
        (WEBP_EXTENDED, ("WebP", (1920, 1080))),
        (b"\xff\xd8\xff", ("JPEG", None)),
        (b"plain bytes", (None, None)),
    ],
)
def test_the_describer_reads_format_and_size_from_the_header(raw, expected):
    assert image_format(raw) == expected


def test_the_describer_takes_every_block_shape_and_never_downloads():
    png = base64.b64decode(SUNSET_PNG)
    said = "演示识图：一张 PNG 图片，4×3 像素，横幅，82 字节（只读了文件头，未识别画面内容）"
    assert len(png) == 82
    assert describe_image({"type": "image", "base64": SUNSET_PNG, "mime_type": "image/png"}) == said
    data_url = {"url": f"data:image/png;base64,{SUNSET_PNG}"}
    assert describe_image({"type": "image_url", "image_url": data_url}) == said
    assert describe_image({"type": "image", "source_type": "base64", "data": SUNSET_PNG}) == said
    tall = base64.b64encode(GIF).decode()
    assert "20×30 像素，竖幅" in describe_image({"type": "image", "base64": tall})
    odd = base64.b64encode(b"????").decode()
    assert "一张 image/x-odd 图片，4 字节" in describe_image(
        {"type": "image", "base64": odd, "mime_type": "image/x-odd"}
    )
    link = describe_image({"type": "image", "url": "http://192.0.2.1/trip/sea.jpg"})
    assert link == "演示识图：一张来自 192.0.2.1 的图片（sea.jpg），离线演示不下载"
    with pytest.raises(ImageError):
        describe_image({"type": "image", "base64": "not base64!"})


@pytest.mark.parametrize(
    ("user", "assistant", "mood"),
    [
        ("今天工作好累，有点烦。", "", "关切"),
        ("谢谢你陪我聊天", "", "开心"),
        ("记住 我周末想去爬山", "", "认真"),
        ("现在几点了？", "", "好奇"),
        ("早上好", "", "平静"),
        ("用 take_note 记一下", "not_allowed: tool 'take_note' …", "为难"),
    ],
)
def test_the_mood_hook_reads_the_turn(user, assistant, mood):
    assert demo_mood(user, assistant, "xilian") == mood


def budget(config: LoopConfig) -> object:
    return config.feature(Compaction).max_context_tokens


def describer(config: LoopConfig) -> object:
    return config.feature(Vision).describer


def streamed_turn(graph, thread: dict, content, persona: str = "xilian") -> None:
    """One owner turn in messages mode, the way the CLI runs it."""
    message = HumanMessage(content, id=uuid.uuid4().hex)
    env = SessionEnv(actor="owner", persona_id=persona)
    list(graph.stream({"messages": [message]}, thread, context=env, stream_mode="messages"))


def test_the_demo_chat_reaches_the_budget_only_after_its_first_turns(tmp_path):
    """`cyrene demo`'s owner chat compacts on its last turn; the ones before stay whole."""
    summarised = []
    with open_checkpointer("memory") as saver:
        graph = build_graph(demo_config(tmp_path), saver)
        thread = {"configurable": {"thread_id": "owner"}}
        for persona, content in OWNER_SCRIPT:
            streamed_turn(graph, thread, content, persona)
            summarised.append(bool(graph.get_state(thread).values.get("summary")))
    assert summarised == [False] * (len(OWNER_SCRIPT) - 1) + [True]


def test_a_streamed_demo_tool_call_keeps_its_arguments(tmp_path):
    with open_checkpointer("memory") as saver:
        graph = build_graph(demo_config(tmp_path), saver)
        streamed_turn(graph, {"configurable": {"thread_id": "n"}}, "记个笔记：周五交报告")
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "记个笔记：周五交报告\n"


def test_the_computed_chat_models_report_langchains_standard_params():
    """What LangChain's standard `test_standard_params` asks of a chat model: provider,
    model name and type, for the demo model and the thinking gate alike."""
    from langchain_core.messages import AIMessage

    from nodes.thinking.policy import ThinkingGate
    from studio.demo.model import DemoChatModel
    from tests.scripted import ScriptedChatModel

    for model in (DemoChatModel(), ThinkingGate(inner=ScriptedChatModel(script=[AIMessage("好")]))):
        params = model._get_ls_params()
        assert params["ls_model_type"] == "chat"
        assert params["ls_provider"] == "cyrene" and params["ls_model_name"] == model._llm_type


def test_a_real_model_gets_its_own_budget_and_no_demo_describer(tmp_path):
    """Issue 32 finding 8: `--model` kept the demo's 256-token budget, so a real chat
    lost '我叫小林' by its twelfth turn, and the offline describer stood between it and
    the pictures."""
    from langchain_core.messages import AIMessage

    from studio.demo.world import DEMO_CONTEXT_TOKENS
    from tests.scripted import ScriptedChatModel

    demo = demo_config(tmp_path)
    real = demo_config(tmp_path, model=ScriptedChatModel(script=[AIMessage("好")]))
    assert (budget(demo), describer(demo)) == (DEMO_CONTEXT_TOKENS, describe_image)
    assert (budget(real), describer(real)) == ("auto", None)
    assert real.tool_names == demo.tool_names, "the tools serve every model"


def test_get_time_answers_in_the_time_blocks_zone(tmp_path, monkeypatch):
    """Issue 32 finding 8: get_time answered in the machine's zone while the time block
    said Asia/Shanghai."""
    import time
    from datetime import datetime
    from zoneinfo import ZoneInfo

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        config = demo_config(tmp_path)
        [get_time] = [t for t in config.tools if t.name == "get_time"]
        said = get_time.invoke({})
        expected = datetime.now(config.zone()).strftime("%Y-%m-%d %H:%M")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert config.zone() == ZoneInfo("Asia/Shanghai")
    assert said == expected
