"""The graph `langgraph dev` serves (see langgraph.json).

Studio brings its own persistence per run, and refuses a compiled graph that
carries a checkpointer, so this graph has none; `make_checkpointer` below is
what langgraph.json's `checkpointer.path` points at, so Studio's checkpoints
land in our SQLite file under the data folder and survive a server restart.

It honours the CLI's environment variables (`studio.settings`), which
`cyrene studio` sets from its options: the data folder is `$CYRENE_DATA`
(default `./.cyrene`); the checkpoints are `$CYRENE_CHECKPOINT`, else
`DATA/checkpoints.db`, the CLI's own file, so a session is shared; memories
are on the Chroma server `$CYRENE_MEMORY_SERVER` (the one `cyrene studio`
starts), else embedded; the model is `$CYRENE_MODEL`, else the offline demo
model; `$CYRENE_GROUP_REPLY` sets `GroupPresence(reply=...)`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from graph.builder import build_graph
from graph.extractions import aresume_extractions
from graph.memory_view import MemoryStoreView
from graph.runs import CyreneGraph
from graph.storage.checkpoint import open_checkpointer
from memory.store import MemoryStore
from nodes.context.settings import ModelView
from nodes.core.config import LoopConfig
from nodes.presence.settings import GroupPresence
from studio.demo.world import demo_config, demo_model, open_demo_store
from studio.settings import (
    CHECKPOINT_ENV,
    DATA_ENV,
    DEFAULT_DATA,
    GROUP_REPLY_ENV,
    MEMORY_SERVER_ENV,
)


def data_folder() -> Path:
    return Path(os.environ.get(DATA_ENV) or DEFAULT_DATA)


def make_config(**overrides: Any) -> LoopConfig:
    """The demo world over the data folder, with every stage of the loop its own step
    (Studio shows each round's model view as `assemble_context`'s update)."""
    model, _ = demo_model()
    reply = os.environ.get(GROUP_REPLY_ENV)
    features = [
        ModelView(own_step=True),
        *([GroupPresence.model_validate({"reply": reply})] if reply else []),
    ]
    store = open_demo_store(data_folder(), os.environ.get(MEMORY_SERVER_ENV) or None)
    return demo_config(data_folder(), model=model, store=store, **overrides).with_features(
        *features
    )


def make_graph(config: LoopConfig) -> CyreneGraph:
    """The demo world's loop, without a checkpointer (Studio supplies persistence)."""
    return build_graph(config, name="cyrene")


# Built once, when the server imports this module (off its event loop): the
# demo world opens an embedded Chroma store, which must not happen per request.
config = make_config()
graph = make_graph(config)
store = MemoryStoreView(config.memory) if isinstance(config.memory, MemoryStore) else None
"""Studio's store view (`langgraph.json`): the demo's memories, read-only. Not compiled into
the graph: the server refuses a graph that brings its own store, and hands its nodes this one."""


@asynccontextmanager
async def make_checkpointer() -> AsyncIterator[BaseCheckpointSaver]:
    """Studio's saver: the async saver for `$CYRENE_CHECKPOINT`, else the CLI's own SQLite
    file in the data folder. On entry, the background extractions a stopped server left
    pending run again."""
    url = os.environ.get(CHECKPOINT_ENV) or f"sqlite:///{data_folder() / 'checkpoints.db'}"
    async with open_checkpointer(url) as saver:
        await aresume_extractions(config, saver)
        yield saver
