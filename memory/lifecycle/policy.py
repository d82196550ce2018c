"""Write policy: what an extractor's output may become."""

from __future__ import annotations

import logging

from memory.items import MemoryItem, Scope, Source, bucket_name, extraction_item_id

log = logging.getLogger("cyrene.memory")


def stamp(
    item: MemoryItem, position: int, *, persona_id: str | None, source: Source
) -> MemoryItem | None:
    """Re-issue an extracted item, the `position`-th the turn writes, as the turn's.

    Extractors deliberately do not know the persona,
    so a persona-scope item usually arrives without one. Whatever the
    extractor put in `persona_id` or `source` is overwritten anyway: a
    persona-scope memory can only land in the persona that produced the turn,
    and provenance is always the run's real session and inbound message. The
    copy gets its id from its real bucket: from its content, or, when `source`
    names a background extraction, from the extraction and the item's position
    (`memory.items.extraction_item_id`), so a re-run of the extraction rewrites
    these records. A persona-scope item from a turn with no persona is dropped
    (it has no owner).
    """
    if item.scope is Scope.PERSONA and not persona_id:
        log.info("dropping persona-scope memory from a persona-less turn")
        return None
    owner = persona_id if item.scope is Scope.PERSONA else None
    bucket = bucket_name(item.scope, owner)
    stamped = {
        "id": extraction_item_id(source.extraction, position, bucket)
        if source.extraction
        else None,
        "persona_id": owner,
        "source": source,
    }
    return MemoryItem.model_validate({**dict(item), **stamped})
