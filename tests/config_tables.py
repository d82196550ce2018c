"""The tables of docs/configuration.md, rendered from the settings models' own fields.

`python -m tests.config_tables` prints them; tests/test_readme.py checks the page
against what this renders, so a field's description lives in one place: its
`Field(description=...)`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from graph import (
    CapacityPolicy,
    Compaction,
    ConversationRecall,
    Extraction,
    Fallbacks,
    Feature,
    GroupPresence,
    Guards,
    LoopConfig,
    ModelView,
    Sessions,
    Thinking,
    ToolCalls,
    TurnEnd,
    Vision,
)
from nodes.core.feature import MOVED_TO_FEATURES

FEATURES: tuple[tuple[type[Feature], str], ...] = (
    (GroupPresence, "nodes/presence"),
    (Compaction, "nodes/compaction"),
    (ModelView, "nodes/context"),
    (ConversationRecall, "nodes/recall"),
    (ToolCalls, "nodes/tools"),
    (CapacityPolicy, "nodes/capacity"),
    (Guards, "nodes/guards"),
    (Vision, "nodes/vision"),
    (Thinking, "nodes/thinking"),
    (Fallbacks, "nodes/fallbacks"),
    (Extraction, "nodes/extraction"),
    (TurnEnd, "nodes/turn_end"),
    (Sessions, "graph/sessions"),
)
"""Every feature's settings, with its folder, in the page's order."""

FACTORY_DEFAULTS = {"retry": "3 attempts", "clock": "UTC now", "hooks": "`ToolHooks()`"}


def default_of(name: str, field: FieldInfo) -> str:
    """A field's default as the table shows it."""
    if field.is_required():
        return "required"
    value: Any = field.default
    if field.default_factory is not None or callable(value):
        return FACTORY_DEFAULTS.get(name) or f"`{field.default_factory()!r}`"  # type: ignore[misc]
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, frozenset) and not value:
        return "empty"
    return f"`{value!r}`"


def table(model: type[BaseModel]) -> str:
    """`model`'s fields as the page's Markdown table."""
    rows = [
        f"| `{name}` | {default_of(name, field)} | {field.description} |"
        for name, field in model.model_fields.items()
    ]
    return "\n".join(["| field | default | what it does |", "|---|---|---|", *rows])


def feature_heading(kind: type[Feature], folder: str) -> str:
    """The feature's heading and the first paragraph of its docstring."""
    summary = " ".join(
        line.strip() for line in (kind.__doc__ or "").strip().split("\n\n")[0].splitlines()
    )
    return f"### `{kind.__name__}` (`{folder}/`)\n\n{summary}"


def moved_table() -> str:
    """Each old `LoopConfig` field and the feature setting it became."""
    rows = [
        f"| `{old}` | `{kind}({field}=...)` |" for old, (kind, field) in MOVED_TO_FEATURES.items()
    ]
    return "\n".join(["| old `LoopConfig` field | now, in `features` |", "|---|---|", *rows])


def main() -> None:
    print(table(LoopConfig))
    for kind, folder in FEATURES:
        print(f"\n{feature_heading(kind, folder)}\n\n{table(kind)}")
    print(f"\n{moved_table()}")


if __name__ == "__main__":
    main()
