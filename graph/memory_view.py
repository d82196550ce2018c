"""`MemoryStoreView`: the memories as a read-only LangGraph `BaseStore`.

Compiled in (`build_graph(config, store=MemoryStoreView(memory))`, or a graph of your own),
a node finds it as `runtime.store` (a tool too, through its runtime); `langgraph.json` names
it for LangGraph Studio's store view. One namespace per bucket
(`memory.storage.layout`):

    ("memories", "user")                 the owner's habits, shared by every persona
    ("memories", "project")              what everyone may read
    ("memories", "persona", "<id>")      one persona's private memories

An item's key is the memory's id and its value the memory's fields (`content`, `kind`,
`scope`, `persona_id`, `source`). A search with a `query` is the store's own ranked search
(`MemoryStore.search`) within the namespaces asked; without one it lists them, newest
first. The view reads as its reader may (`MemoryStore.readable_buckets`): a persona reads
its own bucket and the shared ones, a restricted view only the shared ones, and a view
with no reader every bucket (the owner's, for Studio). Read inside a turn of the loop (a
tool, a middleware, a node of the caller's), it reads no more than that turn's session may:
a group's or a stranger's turn the shared buckets only, an owner's turn its persona's and the
shared ones, whatever reader the view was built with, since one view is compiled into a graph
that serves every session (`session_reader`). Writes go through the store's own
API (`add`, `supersede`, `forget`), which keeps history, aliases, the lexical index and
erasure right: `put` and `delete` raise `MemoryStoreError`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from langgraph.config import get_config
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from memory.errors import MemoryStoreError
from memory.items import MemoryItem, Scope
from memory.store import MemoryStore
from nodes.core.env import SessionEnv
from nodes.core.loop import TRACE_PERSONA
from nodes.kernel.compat import parent_context

ROOT = "memories"
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": operator.eq,
    "$ne": operator.ne,
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


def session_reader() -> tuple[str | None, bool] | None:
    """(persona, restricted) of the loop's turn this code runs in, None outside one: its
    bound `SessionEnv` (the run's context) and the persona it answers as (the run's
    metadata, which the graph writes after binding the run: `nodes.core.loop.TRACE_PERSONA`)."""
    try:
        config = get_config()
    except RuntimeError:  # not inside a runnable
        return None
    env = parent_context(config)
    if not isinstance(env, SessionEnv):
        return None
    persona = (config.get("metadata") or {}).get(TRACE_PERSONA) or env.persona_id
    return persona, env.restricted


def namespace_of(item: MemoryItem) -> tuple[str, ...]:
    """The namespace a memory is shown in."""
    if item.scope is Scope.PERSONA:
        return (ROOT, Scope.PERSONA.value, str(item.persona_id))
    return (ROOT, item.scope.value)


class MemoryStoreView(BaseStore):
    """A `MemoryStore` seen as a read-only LangGraph `BaseStore` (see the module).

    Args:
        store: the memories.
        persona_id: the reading persona (None: every persona's, unless `restricted`).
        restricted: a group's or a stranger's view: shared memories only.

    Example:
        >>> view = MemoryStoreView(store, persona_id="xilian")
        >>> view.search(("memories",), query="咖啡")        # ranked by the store
        >>> view.list_namespaces(prefix=("memories",))
    """

    def __init__(
        self, store: MemoryStore, *, persona_id: str | None = None, restricted: bool = False
    ) -> None:
        self.store = store
        self.persona_id = persona_id
        self.restricted = restricted

    # -- what the reader sees ------------------------------------------------
    def _as_read_here(self) -> MemoryStoreView:
        """This view, narrowed to what the turn it is read in may read (`session_reader`):
        a session of another persona than the view's, or a restricted one, reads the shared
        buckets only."""
        session = session_reader()
        if session is None:
            return self
        persona, restricted = session
        if self.persona_id is not None and persona != self.persona_id:
            restricted = True
        if (persona, restricted) == (self.persona_id, self.restricted):
            return self
        return MemoryStoreView(
            self.store, persona_id=persona, restricted=restricted or self.restricted
        )

    def _readable(self, item: MemoryItem) -> bool:
        if item.scope is not Scope.PERSONA:
            return True
        return not self.restricted and self.persona_id in (None, item.persona_id)

    def _namespaces(self) -> list[tuple[str, ...]]:
        """The namespaces of the buckets the reader sees that hold memories."""
        personas = sorted(
            {
                str(i.persona_id)
                for i in self.store.list(scope=Scope.PERSONA, persona_id=self.persona_id)
                if self._readable(i)
            }
        )
        shared = [(ROOT, s.value) for s in (Scope.USER, Scope.PROJECT)]
        return [*shared, *((ROOT, Scope.PERSONA.value, p) for p in personas)]

    def _memories(self, prefix: tuple[str, ...]) -> list[MemoryItem]:
        """The readable memories in namespaces under `prefix`, newest first."""
        items = [
            i
            for i in self.store.list()
            if self._readable(i) and namespace_of(i)[: len(prefix)] == prefix
        ]
        return sorted(items, key=lambda i: i.created_at, reverse=True)

    # -- BaseStore -------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run get, search and list-namespaces operations; a put (or delete) is refused.

        Raises:
            MemoryStoreError: a put or delete: writes go through `MemoryStore`'s API.
        """
        ops = list(ops)
        if any(isinstance(op, PutOp) for op in ops):
            raise MemoryStoreError(
                "the memories' LangGraph store is read-only: write through MemoryStore's "
                "API (add, supersede, forget), which keeps history, aliases and erasure"
            )
        view = self._as_read_here()
        return [view._run(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return self.batch(ops)

    def _run(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise TypeError(f"unknown store operation {type(op).__name__}")

    def _get(self, op: GetOp) -> Item | None:
        item = self.store.get(op.key)
        if item is None or not self._readable(item) or namespace_of(item) != op.namespace:
            return None
        return _item(item, Item)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        if not op.query:
            found = [(i, None) for i in self._memories(prefix) if _passes(i, op.filter)]
            return [_item(i, SearchItem) for i, _ in found[op.offset : op.offset + op.limit]]
        hits: dict[str, tuple[MemoryItem, float]] = {}
        for reader in self._readers(prefix):
            k = op.offset + op.limit
            for hit in self.store.search(op.query, reader, self.restricted, k=k):
                inside = namespace_of(hit.item)[: len(prefix)] == prefix
                if inside and self._readable(hit.item) and _passes(hit.item, op.filter):
                    hits[str(hit.item.id)] = (hit.item, hit.score)
        ranked = sorted(hits.values(), key=lambda pair: pair[1], reverse=True)
        return [
            _item(item, SearchItem, score=score)
            for item, score in ranked[op.offset : op.offset + op.limit]
        ]

    def _readers(self, prefix: tuple[str, ...]) -> list[str | None]:
        """Whom to search as: the view's reader, or (a view of every bucket) each persona
        whose namespace is under `prefix`, and no persona for the shared ones."""
        if self.persona_id is not None or self.restricted:
            return [self.persona_id]
        under = [ns for ns in self._namespaces() if ns[: len(prefix)] == prefix]
        shared: list[str | None] = [None] if any(len(ns) == 2 for ns in under) else []
        return [*shared, *(ns[2] for ns in under if len(ns) == 3)]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = [
            ns
            for ns in self._namespaces()
            if all(_matches(ns, condition) for condition in op.match_conditions or ())
        ]
        if op.max_depth is not None:
            found = list(dict.fromkeys(ns[: op.max_depth] for ns in found))
        return found[op.offset : op.offset + op.limit]


def _item(item: MemoryItem, kind: Any, **extra: Any) -> Any:
    when = datetime.fromtimestamp(item.created_at, tz=UTC)
    value = item.model_dump(mode="json", exclude={"id", "created_at"})
    return kind(
        namespace=namespace_of(item),
        key=str(item.id),
        value=value,
        created_at=when,
        updated_at=when,
        **extra,
    )


def _passes(item: MemoryItem, where: Mapping[str, Any] | None) -> bool:
    """Whether a memory's value meets a store filter (equality, or `$eq`, `$ne`, `$gt`, …)."""
    value = item.model_dump(mode="json")
    for field, wanted in (where or {}).items():
        tests = wanted if isinstance(wanted, dict) else {"$eq": wanted}
        for name, operand in tests.items():
            if name not in _COMPARE:
                raise ValueError(f"store filter {field!r}: unknown operator {name!r}")
            try:
                if not _COMPARE[name](value.get(field), operand):
                    return False
            except TypeError:  # compared with None, or across types
                return False
    return True


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(want in ("*", got) for want, got in zip(path, part, strict=True))
