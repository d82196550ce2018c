"""Memory items, scopes and provenance: validated at the boundary.

A `MemoryItem` is rejected when it is built wrong (empty content, unknown
scope, a persona-scope item without a persona), so nothing half-valid reaches
the store. Its id is derived from what it says and where it lives, which makes
re-adding the same memory an upsert rather than a duplicate.
"""

from __future__ import annotations

import hashlib
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Scope(StrEnum):
    """Who may read a memory (DESIGN §4)."""

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
    message_id: str | None = None


class MemoryItem(BaseModel):
    """One long-term memory."""

    model_config = ConfigDict(frozen=True)

    content: str
    kind: str = "fact"
    scope: Scope = Scope.USER
    persona_id: str | None = None
    source: Source = Field(default_factory=Source)
    created_at: float = Field(default_factory=time.time)
    id: str | None = None

    @field_validator("content")
    @classmethod
    def _content_not_empty(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("content: a memory needs non-empty content")
        return value

    @field_validator("kind")
    @classmethod
    def _kind_not_empty(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("kind: must not be empty")
        return value

    @model_validator(mode="after")
    def _persona_matches_scope(self) -> MemoryItem:
        if self.scope is Scope.PERSONA and not self.persona_id:
            raise ValueError("persona_id: a persona-scope memory needs the persona it belongs to")
        if self.scope is not Scope.PERSONA and self.persona_id:
            # Shared scopes belong to no persona; dropping the id keeps reads structural.
            object.__setattr__(self, "persona_id", None)
        if self.id is None:
            object.__setattr__(self, "id", self.content_id())
        return self

    @property
    def bucket(self) -> str:
        """The Chroma collection holding this item."""
        return bucket_name(self.scope, self.persona_id)

    def content_id(self) -> str:
        """Stable id from bucket, kind and content: re-adding the same memory upserts it."""
        key = f"{bucket_name(self.scope, self.persona_id)}\x00{self.kind}\x00{self.content}"
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
        ):
            if value:
                meta[key] = value
        return meta

    @classmethod
    def from_record(cls, item_id: str, document: str, meta: dict[str, Any]) -> MemoryItem:
        return cls(
            id=item_id,
            content=document,
            kind=meta.get("kind", "fact"),
            scope=Scope(meta.get("scope", Scope.USER)),
            persona_id=meta.get("persona_id"),
            source=Source(
                session_id=meta.get("source_session_id"),
                message_id=meta.get("source_message_id"),
            ),
            created_at=float(meta.get("created_at", 0.0)),
        )


def bucket_name(scope: Scope, persona_id: str | None) -> str:
    """`persona_<id>`, `user` or `project` (one Chroma collection per bucket)."""
    if scope is Scope.PERSONA:
        return f"persona_{persona_id}"
    return scope.value
