"""Whether an owner's words name a stored memory: what a forget or a correction may change.

A forget erases text for good and a correction buries a fact, so neither may
guess. "忘掉吧，没什么", "forget that, never mind" and "更正一下，我刚才说错了"
name nothing (`named` strips the filler and finds nothing left); "忘掉我的银行卡号"
names a card number, which a stored card *password* is not. Two tests, measured
on `tests/data/memory_phrases.jsonl` (72 phrases, both languages; 0 wrong
erasures):

- `covers`: every content term of the named words is in the memory (a CJK
  character, or a Latin word by its stem): the bar for a forget.
- `shares`: at least `SHARED` of them are (a correction changes the value and
  keeps the subject): the bar for a supersede, with the store's relevance.
"""

from __future__ import annotations

import re

from memory.embedding import has_cjk

SHARED = 0.2
"""A correction's terms the memory it supersedes must hold (the subject, not the value)."""

_CJK_FILLER = (
    "那条记忆", "这条记忆", "记忆", "名字", "习惯", "事情", "内容", "信息", "那段", "这段",
    "没什么", "没事", "算了", "不好意思", "刚才", "刚刚", "之前", "以前", "那条", "这条",
    "那个", "这个", "那些", "这些", "那件事", "这件事", "的事", "的话", "说的话", "说的",
    "说过", "说错了", "说错", "错了", "一下", "哪里", "哪儿", "什么", "主人", "我的",
    "我们", "你的", "一切", "所有", "全部", "吧", "啊", "呀", "了", "吗", "呢", "嘛",
    "哦", "的", "我", "你", "它", "他", "她", "这", "那", "条", "件", "些", "个", "事",
)  # fmt: skip
_LATIN_FILLER = frozenset(
    [
        "a",
        "an",
        "the",
        "that",
        "this",
        "it",
        "its",
        "about",
        "never",
        "mind",
        "please",
        "i",
        "i'm",
        "me",
        "my",
        "mine",
        "you",
        "your",
        "we",
        "our",
        "is",
        "am",
        "are",
        "was",
        "were",
        "be",
        "been",
        "is",
        "to",
        "in",
        "on",
        "at",
        "of",
        "for",
        "and",
        "or",
        "but",
        "so",
        "just",
        "what",
        "which",
        "everything",
        "all",
        "anything",
        "something",
        "said",
        "say",
        "wrong",
        "sorry",
        "now",
        "then",
    ]
)
_LATIN = re.compile(r"[a-z0-9']+")
_CJK_CHAR = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[0-9]+")


_SUFFIXES = ("ing", "ies", "ed", "es", "ic", "y", "s")


def _stem(word: str) -> str:
    """A Latin word's crude stem, its endings taken off until none is left: enough that
    lives / living / lived, allergy / allergic and Saturday / Saturdays meet."""
    word = word.removesuffix("'s")
    while stripped := next(
        (word[: -len(s)] for s in _SUFFIXES if word.endswith(s) and len(word) - len(s) >= 2),
        None,
    ):
        word = stripped
    return word


def terms(text: str) -> set[str]:
    """The content terms of `text`: CJK characters and numbers, and Latin stems, without
    the filler that names nothing (pronouns, particles, "刚才那句", "never mind")."""
    folded = text.casefold()
    for filler in _CJK_FILLER:
        folded = folded.replace(filler, " ")
    cjk = set(_CJK_CHAR.findall(folded)) if has_cjk(folded) else set()
    return cjk | {_stem(w) for w in _LATIN.findall(folded) if w not in _LATIN_FILLER}


def named(text: str) -> bool:
    """Whether `text` names something at all (a content term is left without the filler)."""
    return bool(terms(text))


def covers(memory: str, text: str) -> bool:
    """Every content term of `text` is in `memory`: the words name this memory."""
    asked, held = terms(text), terms(memory)
    return bool(asked) and asked <= held


def shares(memory: str, text: str) -> float:
    """The share of `text`'s content terms that `memory` holds."""
    asked = terms(text)
    return len(asked & terms(memory)) / len(asked) if asked else 0.0
