"""`stages_of`: which of the loop's stages a config switches on, read from the features' settings."""

from __future__ import annotations

from langgraph.graph import END

from nodes.compaction.settings import Compaction
from nodes.context.settings import ModelView
from nodes.core.config import LoopConfig
from nodes.core.stages import ASSEMBLE, CALL, COMPACT, EXTRACT, FINISH, VISION, Stages
from nodes.presence.settings import GroupPresence
from nodes.turn_end.settings import TurnEnd
from nodes.vision.settings import Vision


def stages_of(config: LoopConfig) -> Stages:
    """Where each part of a turn goes under `config` (decided once, at build time)."""
    own_step = config.feature(ModelView).own_step
    view = ASSEMBLE if own_step else CALL
    round_start = COMPACT if config.feature(Compaction).on and own_step else view
    after_extract = FINISH if config.feature(TurnEnd).on else END
    extracting = config.extractor is not None and config.memory is not None
    return Stages(
        view=view,
        round_start=round_start,
        turn_start=VISION if config.feature(Vision).on else round_start,
        after_extract=after_extract,
        after_reply=EXTRACT if extracting else after_extract,
        presence=config.feature(GroupPresence).decides,
    )
