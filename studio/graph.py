"""The graph `langgraph dev` serves (see langgraph.json).

Studio brings its own persistence per run, and refuses a compiled graph that
carries a checkpointer, so this graph has none; `make_checkpointer` below is
what langgraph.json's `checkpointer.path` points at, so Studio's checkpoints
land in our SQLite file under the data folder and survive a server restart.

The data folder is `$CYRENE_DATA` (default `./.cyrene`); the model is
`$CYRENE_MODEL` when set, else the offline demo model.
"""

from __future__ import annotations

import os
from pathlib import Path

from graph.builder import build_graph
from graph.checkpoint import open_checkpointer
from graph.runs import CyreneGraph
from studio.demo import DATA_ENV, DEFAULT_DATA, demo_config, demo_model


def data_folder() -> Path:
    return Path(os.environ.get(DATA_ENV) or DEFAULT_DATA)


def make_graph() -> CyreneGraph:
    """The demo world's loop, without a checkpointer (Studio supplies persistence)."""
    model, _ = demo_model()
    return build_graph(demo_config(data_folder(), model=model), name="cyrene")


# Built once, when the server imports this module (off its event loop): the
# demo world opens an embedded Chroma store, which must not happen per request.
graph = make_graph()


def make_checkpointer() -> open_checkpointer:
    """Studio's saver: the async SQLite saver over `<data>/studio-checkpoints.db`."""
    return open_checkpointer(f"sqlite:///{data_folder() / 'studio-checkpoints.db'}")
