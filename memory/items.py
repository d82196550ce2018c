"""Memory items, scopes and provenance: validated at the boundary.

A `MemoryItem` is rejected when it is built wrong (empty content or kind,
unknown scope), so nothing half-valid reaches the store. A persona-scope item
may leave `persona_id` unset: extractors deliberately do not know the persona,
and the loop stamps the turn's persona over it (`memory.lifecycle.policy.stamp`); the
store refuses an item that is still unowned (`require_owner`).

Its id is derived from what it says and where it lives, which makes re-adding
the same memory an upsert rather than a duplicate. An item a background
extraction wrote is the exception: its id comes from the extraction and its
place in the extraction's output (`extraction_item_id`), so running the
extraction again, even with other words, rewrites it instead of adding one.

Lone surrogates (code points U+D800–U+DFFF, which no UTF-8 store can hold) in
any text field are replaced with U+FFFD here, one character for one: this is
the layer's one policy for them, so nothing past this point has to care.
"""

from __future__ import annotations

import hashlib
import time
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nodes.kernel.text import clean_text

UNOWNED_PERSONA_BUCKET = "persona"
"""The bucket key of a persona item that has no persona yet: never a collection."""


def _clean_optional(value: str | None) -> str | None:
    return clean_text(value) if isinstance(value, str) else value


class Scope(StrEnum):
    """Who may read a memory (`memory.retrieval.search` applies it)."""

    PERSONA = "persona"
    """One persona's private daily memory — the owner's sensitive data."""
    USER = "user"
    """The owner's habits, shared by all personas."""
    PROJECT = "project"
    """Everyone may read, restricted sessions included."""


class Source(BaseModel):
    """Where a memory came from: stamped by the loop, never authored by a model."""

    model_config = ConfigDict(frozen=True)

    session_id: str | None = None
    """The session it was said in, as the app names it (`SessionEnv.session_id`)."""
    message_id: str | None = None
    """The message or turn it was said in, as the app names it (`SessionEnv.turn_id`)."""
    extraction: str | None = None
    """The background extraction that wrote it (its ledger key): a re-run of that
    extraction replaces what this one wrote."""
    thread_id: str | None = None
    """The thread the turn ran in, whatever the app calls the session: with `opening_id`,
    the turn a forget takes out of that thread's view (`MemoryStore.forgotten_turns`)."""
    opening_id: str | None = None
    """The id of the human message that opened the turn in its thread."""

    _clean = field_validator("session_id", "message_id", "extraction", "thread_id", "opening_id")(
        _clean_optional
    )


RESERVED_ID_PREFIX = "alias:"
"""Ids the store keeps for the words a superseded memory leaves behind (`memory.retrieval.aliases`)."""


class MemoryItem(BaseModel):
    """One long-term memory."""

    model_config = ConfigDict(frozen=True)

    content: str
    kind: str = "fact"
    scope: Scope = Scope.USER
    persona_id: str | None = None
    source: Source = Field(default_factory=Source)
    created_at: float = Field(default_factory=time.time, validate_default=True)
    id: str | None = None

    @field_validator("created_at")
    @classmethod
    def _to_the_millisecond(cls, value: float) -> float:
        """Chroma keeps about 16 significant digits of a float, so today's `time.time()`
        comes back without its last digits and an item read back would not equal the
        one stored (one in ten did); milliseconds round-trip exactly."""
        return round(value, 3)

    @field_validator("content", "kind")
    @classmethod
    def _text_not_empty(cls, value: str, info: ValidationInfo) -> str:
        value = clean_text(value).strip()
        if not value:
            raise ValueError(f"{info.field_name}: must not be empty")
        return value

    _clean_persona = field_validator("persona_id")(_clean_optional)

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        """A memory named like an alias would be deleted with the memory it names."""
        if value is not None and value.startswith(RESERVED_ID_PREFIX):
            raise ValueError(f"id: {RESERVED_ID_PREFIX!r} ids are the store's own (aliases)")
        return value

    @model_validator(mode="after")
    def _persona_matches_scope(self) -> MemoryItem:
        if self.scope is not Scope.PERSONA or not self.persona_id:
            # Shared scopes belong to no persona (dropping the id keeps reads
            # structural), and '' is no persona either.
            object.__setattr__(self, "persona_id", None)
        if self.id is None:
            object.__setattr__(self, "id", self.content_id())
        return self

    @property
    def bucket(self) -> str:
        """The bucket holding this item: `persona_<id>`, `user` or `project`."""
        return bucket_name(self.scope, self.persona_id)

    def content_id(self) -> str:
        """Stable id from bucket, kind and content: re-adding the same memory upserts it.

        An unstamped persona item gets an id of its own; the stamped copy gets
        the id of the persona's bucket.
        """
        key = f"{self.bucket}\x00{self.kind}\x00{self.content}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def metadata(self) -> dict[str, Any]:
        """Flat Chroma metadata (no None values: Chroma rejects them)."""
        meta: dict[str, Any] = {
            "kind": self.kind,
            "scope": self.scope.value,
            "created_at": float(self.created_at),
        }
        for key, value in (
            ("persona_id", self.persona_id),
            ("source_session_id", self.source.session_id),
            ("source_message_id", self.source.message_id),
            ("source_extraction", self.source.extraction),
            ("source_thread_id", self.source.thread_id),
            ("source_opening_id", self.source.opening_id),
        ):
            if value:
                meta[key] = value
        return meta

    @classmethod
    def from_record(cls, item_id: str, document: str, meta: dict[str, Any]) -> MemoryItem:
        """The item a Chroma record (id, document, metadata) holds."""
        return cls(
            id=item_id,
            content=document,
            kind=meta.get("kind", "fact"),
            scope=Scope(meta.get("scope", Scope.USER)),
            persona_id=meta.get("persona_id"),
            source=Source(
                session_id=meta.get("source_session_id"),
                message_id=meta.get("source_message_id"),
                extraction=meta.get("source_extraction"),
                thread_id=meta.get("source_thread_id"),
                opening_id=meta.get("source_opening_id"),
            ),
            created_at=float(meta.get("created_at", 0.0)),
        )


def extraction_item_id(extraction: str, position: int, bucket: str) -> str:
    """The id of the `position`-th item a background extraction wrote, in `bucket`.

    Not from the content: a model words a fact differently on every run, and a
    run that a crash cut off between storing its items and marking them done
    is run again; with these ids the re-run rewrites the same records.
    """
    key = f"{bucket}\x00extraction\x00{extraction}\x00{position}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def bucket_name(scope: Scope, persona_id: str | None) -> str:
    """`persona_<id>`, `user` or `project` (one Chroma collection per bucket).

    A persona scope without a persona is `persona`: a key for ids only, since
    the store refuses to write such an item.
    """
    if scope is Scope.PERSONA:
        return f"persona_{persona_id}" if persona_id else UNOWNED_PERSONA_BUCKET
    return scope.value


def require_owner(item: MemoryItem) -> None:
    """Raise `ValueError` when a persona-scope item still has no persona.

    Raises:
        ValueError: the item is persona-scope and `persona_id` is unset.
    """
    if item.scope is Scope.PERSONA and not item.persona_id:
        raise ValueError(
            "persona_id: a persona-scope memory needs the persona it belongs to "
            f"(item {item.id}: {item.content[:40]!r}); the loop stamps it for extractors, "
            "other writers must set it"
        )
