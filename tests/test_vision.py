"""Vision: pass-through, folding into descriptions with a per-session cache, bad images."""

from __future__ import annotations

import base64
import hashlib

from langchain_core.messages import AIMessage, HumanMessage

from graph import Vision, build_graph, open_checkpointer
from tests.conftest import make_config, thread
from tests.scripted import ScriptedChatModel

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 10
PNG_B64 = base64.b64encode(PNG).decode()
DIGEST = hashlib.sha256(PNG).hexdigest()


def image(data: str = PNG_B64) -> dict:
    return {"type": "image", "base64": data, "mime_type": "image/png"}


class Describer:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, block: dict) -> str:
        self.calls += 1
        if self.fail:
            raise RuntimeError("ocr down")
        return "一只橘猫趴在键盘上"


def send(content, turns: int = 1, **overrides):
    model = ScriptedChatModel(script=[AIMessage("看到了")] * turns)
    with open_checkpointer("memory") as saver:
        graph = build_graph(make_config(model, **overrides), saver)
        for i in range(turns):
            out = graph.invoke({"messages": [HumanMessage(content, id=f"img{i}")]}, thread("v"))
    return model, out


def test_without_a_describer_images_pass_through():
    model, _ = send([{"type": "text", "text": "看图"}, image()])
    assert model.requests[0].messages[-1].content == [{"type": "text", "text": "看图"}, image()]


def test_a_vision_capable_model_keeps_the_image():
    describer = Describer()
    model, _ = send([image()], features=[Vision(describer=describer, model_accepts_images=True)])
    assert describer.calls == 0 and model.requests[0].messages[-1].content == [image()]


def test_images_fold_into_descriptions_described_once_per_session():
    describer = Describer()
    content = [
        {"type": "text", "text": "这两张一样吗"},
        image(),
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
    ]
    model, out = send(
        content, turns=2, features=[Vision(describer=describer, model_accepts_images=False)]
    )
    assert describer.calls == 1, "two identical images over two turns are described once"
    sent = model.requests[1].messages[-1].content
    folded = f"[图片 {DIGEST[:12]}：描述：一只橘猫趴在键盘上]"
    assert sent == [
        {"type": "text", "text": "这两张一样吗"},
        {"type": "text", "text": folded},
        {"type": "text", "text": folded},
    ]
    refs = out["messages"][-2].response_metadata["cyrene"]["images"]
    assert refs == [{"hash": DIGEST, "url": None, "size": len(PNG), "mime_type": "image/png"}] * 2
    assert out["image_descriptions"] == {DIGEST: "一只橘猫趴在键盘上"}


def test_url_images_keep_their_url():
    describer = Describer()
    _, out = send(
        [{"type": "image", "url": "https://example.invalid/cat.png"}],
        features=[Vision(describer=describer, model_accepts_images=False)],
    )
    [ref] = out["messages"][0].response_metadata["cyrene"]["images"]
    assert ref["url"] == "https://example.invalid/cat.png" and ref["size"] is None


def test_bad_images_become_placeholders_and_the_turn_goes_on():
    describer = Describer()
    oversized = base64.b64encode(PNG[:8] + b"x" * 2040).decode()  # a 2,048-byte PNG
    content = [image("not base64!!"), image(oversized)]
    model, out = send(
        content,
        features=[Vision(describer=describer, model_accepts_images=False, max_image_bytes=1024)],
    )
    texts = [b["text"] for b in model.requests[0].messages[-1].content]
    assert texts[0] == "[图片：图片数据无法解码，未能识别]"
    assert texts[1].endswith("图片过大（2048 字节，上限 1024 字节），未能识别]")
    assert describer.calls == 0 and out["messages"][-1].content == "看到了"


def test_a_failing_describer_becomes_a_placeholder():
    model, out = send(
        [image()], features=[Vision(describer=Describer(fail=True), model_accepts_images=False)]
    )
    assert model.requests[0].messages[-1].content == [
        {"type": "text", "text": f"[图片 {DIGEST[:12]}：识别失败（RuntimeError）]"}
    ]
    assert out["messages"][-1].content == "看到了"


def test_a_vision_chat_model_can_describe():
    vision_model = ScriptedChatModel(script=[AIMessage("截图里写着 hello")])
    model, _ = send(
        [image()], features=[Vision(describer=vision_model, model_accepts_images=False)]
    )
    asked = vision_model.requests[0].messages[0].content
    assert asked[1] == image() and "描述" in asked[0]["text"]
    assert "截图里写着 hello" in model.requests[0].messages[-1].content[0]["text"]
