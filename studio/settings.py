"""The environment variables every front end honours, and the default data folder.

One table for the CLI (each sets an option's default), Studio's graph and the
launcher between them (docs/extras-and-environment.md "Environment variables").
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_DATA = Path(".cyrene")
DATA_ENV = "CYRENE_DATA"
"""The data folder (`--data`): checkpoints.db, memory/, audit.jsonl, capacity.jsonl."""
CHECKPOINT_ENV = "CYRENE_CHECKPOINT"
"""The checkpoint URL (`--checkpoint`); unset: sqlite:///DATA/checkpoints.db."""
MODEL_ENV = "CYRENE_MODEL"
"""The chat model, `provider:model` (`--model`); unset: the offline demo model."""
MEMORY_SERVER_ENV = "CYRENE_MEMORY_SERVER"
"""A Chroma server's HOST:PORT (`--memory-server`); unset: the one `cyrene studio` runs, or
the embedded store."""
GROUP_REPLY_ENV = "CYRENE_GROUP_REPLY"
"""Which group turns are answered (`--group-reply`); unset: the demo world's `always`."""
