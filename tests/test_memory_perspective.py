"""An owner's question is also read in the words the owner's memories are written in."""

from __future__ import annotations

import pytest

from memory.retrieval.perspective import owner_perspective


@pytest.mark.parametrize(
    ("question", "read_as"),
    [
        ("我的宠物叫什么名字？", "主人的宠物叫什么名字？"),
        ("我们周末去哪玩？", "我们周末去哪玩？"),  # "we" includes the companion
        ("Can I have a milkshake?", "Can the owner have a milkshake?"),
        ("What am I allergic to?", "What is the owner allergic to?"),
        (
            "I'm tired, remind me what my plan was",
            "the owner is tired, remind the owner what the owner's plan was",
        ),
        ("Is this mine? Irish tea, Iceland", "Is this the owner's? Irish tea, Iceland"),
    ],
)
def test_the_owners_i_reads_as_the_owner(question, read_as):
    assert owner_perspective(question) == read_as
