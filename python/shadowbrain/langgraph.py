"""shadowbrain as a LangGraph store (``pip install 'shadowbrain[langgraph]'``).

``ShadowbrainStore(memory)`` is a ``langgraph.store.base.BaseStore``: compile a graph with
``store=ShadowbrainStore(memory)`` and its nodes' ``store.put``, ``get``, ``search`` (with
a natural-language ``query`` and a ``filter``), ``delete`` and ``list_namespaces`` are kept
durably in shadowbrain, ranked by its recall.

The mapping (docs/python.md, "LangGraph"):

- The store acts in the ``Memory``'s shadowbrain namespace; LangGraph's namespace tuples
  live inside it. Each item ``(namespace, key)`` is one shadowbrain session, named
  ``lg:<label>:<label>:…:<key>`` with every character outside ``A-Z a-z 0-9 . -`` escaped
  as ``_`` and its UTF-8 bytes in hex (``_3a`` for ``:``), or ``lgh:<sha-256>`` when that
  is longer than a session id may be (128).
- Each ``put`` writes one pinned record of kind ``langgraph_item``: the value whole in
  ``content``, its text (the whole value, or the fields ``index`` names) in ``text`` for
  the embedder, the tuple, key and creation time in ``metadata["langgraph"]``. The
  previous value is marked ``obsolete``, so recall never returns it and its history shows
  every value the item had. ``delete`` archives the current value.
- ``search`` with a ``query`` is shadowbrain's recall over the namespace, restricted to
  these records, then to the namespace prefix and the ``filter``; each result's ``score``
  is the recall's. Without a query it lists the prefix's items, the most recently updated
  first.
- TTLs are not supported (``supports_ttl`` is false): the policy decides what fades, and
  these records are pinned, so nothing the graph stored fades.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

try:
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
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "shadowbrain.langgraph needs LangGraph: pip install 'shadowbrain[langgraph]' "
        f"(or langgraph) ({e})"
    ) from e

from ._memory import AsyncMemory, Memory
from ._types import Record
from .errors import error_from

ITEM_KIND = "langgraph_item"
"""The kind of the records a ``ShadowbrainStore`` keeps its items in."""

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_READABLE = "lg:"
_HASHED = "lgh:"
_MAX_ID = 128
# Recall ranks at most this many memories (the contract's `k` ceiling).
_MAX_K = 200
# Enough of a session's newest records to find its current value past any record
# something else (a condensation) put there.
_NEWEST = 20


def _escape(part: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"_{b:02x}" for b in c.encode()) for c in part)


def _unescape(part: str) -> str:
    out = bytearray()
    i = 0
    while i < len(part):
        if part[i] == "_":
            out.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            out += part[i].encode()
            i += 1
    return out.decode()


def session_of(namespace: tuple[str, ...], key: str) -> str:
    """The shadowbrain session that holds the item ``(namespace, key)``."""
    readable = _READABLE + ":".join(_escape(p) for p in (*namespace, key))
    if len(readable) <= _MAX_ID:
        return readable
    digest = hashlib.sha256(json.dumps([list(namespace), key]).encode()).hexdigest()
    return _HASHED + digest


def _decoded(session_id: str) -> tuple[tuple[str, ...], str] | None:
    if not session_id.startswith(_READABLE):
        return None
    parts = [_unescape(p) for p in session_id[len(_READABLE) :].split(":")]
    return tuple(parts[:-1]), parts[-1]


def _text_at(value: Any, path: Sequence[str]) -> list[str]:
    if not path:
        if isinstance(value, str):
            return [value]
        return [json.dumps(value, ensure_ascii=False)] if value is not None else []
    head, rest = path[0], path[1:]
    if head == "[*]" or head == "*":
        items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
        return [t for v in items for t in _text_at(v, rest)]
    if isinstance(value, dict) and head in value:
        return _text_at(value[head], rest)
    if isinstance(value, list) and head.lstrip("-").isdigit():
        index = int(head)
        return _text_at(value[index], rest) if -len(value) <= index < len(value) else []
    return []


def _path(field: str) -> list[str]:
    # `a.b`, `a[0]`, `a[*].b`: the field paths LangGraph's `index` names.
    out: list[str] = []
    for piece in field.split("."):
        while "[" in piece:
            name, _, rest = piece.partition("[")
            if name:
                out.append(name)
            inner, _, piece = rest.partition("]")
            out.append("[*]" if inner == "*" else inner)
        if piece:
            out.append(piece)
    return out


def _value_text(key: str, value: Mapping[str, Any], fields: Sequence[str] | None) -> str:
    if fields is None or "$" in fields:
        texts = [
            f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
            for k, v in value.items()
        ]
    else:
        texts = [t for f in fields for t in _text_at(value, _path(f))]
    text = "\n".join(t for t in texts if t.strip())
    return text or key


def _operator(value: Any, op: str, wanted: Any) -> bool:
    if op == "$eq":
        return bool(value == wanted)
    if op == "$ne":
        return bool(value != wanted)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        try:
            a, b = float(value), float(wanted)
        except (TypeError, ValueError):
            return False
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
    raise error_from(
        "invalid_filter",
        f"filter operator {op!r} is not supported; use $eq, $ne, $gt, $gte, $lt or $lte",
    )


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: equality, nested dicts, lists element by element, and
    the comparison operators."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(value, k, v) for k, v in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_matches(a, b) for a, b in zip(value, wanted))
        )
    return bool(value == wanted)


def _condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path)
        if condition.match_type == "prefix"
        else zip(reversed(namespace), reversed(path))
    )
    return all(p == "*" or n == p for n, p in pairs)


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class ShadowbrainStore(BaseStore):
    """A LangGraph store kept in shadowbrain (see the module's documentation).

    ``memory`` is a ``Memory`` or ``AsyncMemory``, embedded or a client. ``fields`` are the
    value's paths whose text is embedded for ``search`` (``["text"]``, ``["facts[*].what"]``);
    by default the whole value. A ``put``'s own ``index`` list overrides them for that item;
    ``index=False`` embeds only the key.
    """

    supports_ttl = False

    def __init__(self, memory: Memory | AsyncMemory, *, fields: Sequence[str] | None = None) -> None:
        self.memory = memory.sync if isinstance(memory, AsyncMemory) else memory
        self.fields = None if fields is None else list(fields)
        # The tuple and key of hashed session ids, once read (they never change).
        self._hashed: dict[str, tuple[tuple[str, ...], str]] = {}
        # A put reads the current value, writes the new one, then retires the old: two at
        # once on one item would both retire the same value and leave two current.
        self._writing = threading.Lock()

    def __repr__(self) -> str:
        return f"ShadowbrainStore({self.memory!r})"

    # BaseStore's two abstract methods: every public method comes through them.
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Runs ``ops`` in order, each seeing the ones before it; answers their results in
        the same order."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                with self._writing:
                    self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise error_from(
                    "invalid_operation", f"{type(op).__name__} is not a LangGraph store operation"
                )
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch`` on a worker thread, so the event loop never waits on the runtime."""
        return await asyncio.to_thread(self.batch, list(ops))

    def _current(self, session_id: str) -> Record | None:
        """The newest record of the item's session: its current value, archived if the
        item was deleted."""
        for record in self.memory.timeline(session_id, limit=_NEWEST):
            if record.kind == ITEM_KIND and record.status != "obsolete":
                return record
        return None

    @staticmethod
    def _live(record: Record | None) -> Record | None:
        return record if record is not None and record.status in ("pinned", "active") else None

    @staticmethod
    def _parts(record: Record) -> tuple[tuple[str, ...], str, datetime, datetime]:
        meta = record.metadata["langgraph"]
        created = _when(meta.get("created_at") or record.timestamp)
        return tuple(meta["namespace"]), meta["key"], created, _when(record.timestamp)

    def _item(self, record: Record) -> Item:
        namespace, key, created, updated = self._parts(record)
        return Item(
            value=record.content,
            key=key,
            namespace=namespace,
            created_at=created,
            updated_at=updated,
        )

    def _hit(self, record: Record, score: float | None = None) -> SearchItem:
        namespace, key, created, updated = self._parts(record)
        return SearchItem(namespace, key, record.content, created, updated, score)

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        record = self._live(self._current(session_of(tuple(namespace), key)))
        return None if record is None else self._item(record)

    def _put(self, op: PutOp) -> None:
        namespace = tuple(op.namespace)
        session_id = session_of(namespace, op.key)
        previous = self._live(self._current(session_id))
        if op.value is None:
            if previous is not None:
                self.memory.forget(previous.id)
            return
        if op.ttl is not None:
            raise error_from(
                "invalid_ttl",
                "ShadowbrainStore keeps items until they are deleted (the policy fades "
                "nothing it stores); put without ttl",
            )
        value = dict(op.value)
        if op.index is False:
            text = op.key
        else:
            text = _value_text(op.key, value, op.index if op.index is not None else self.fields)
        meta: dict[str, Any] = {"namespace": list(namespace), "key": op.key}
        if previous is not None:
            meta["created_at"] = previous.metadata["langgraph"].get("created_at") or previous.timestamp
        self.memory.record(
            session_id,
            [
                {
                    "kind": ITEM_KIND,
                    "text": text,
                    "content": value,
                    "metadata": {"langgraph": meta},
                    "pinned": True,
                }
            ],
        )
        if previous is not None:
            self.memory.mark(previous.id, "obsolete", reason="replaced by a newer value (put)")

    def _items(
        self, read: dict[str, Record | None] | None = None
    ) -> dict[str, tuple[tuple[str, ...], str]]:
        """Every item's session, with its namespace tuple and key; the current records
        read on the way (a hashed id's first time) are left in ``read``, so the caller
        does not read them again."""
        out: dict[str, tuple[tuple[str, ...], str]] = {}
        for session in self.memory.sessions():
            sid = session.session_id
            decoded = _decoded(sid)
            if decoded is None and sid.startswith(_HASHED):
                decoded = self._hashed.get(sid)
                if decoded is None:
                    current = self._current(sid)
                    if read is not None:
                        read[sid] = current
                    if current is not None:
                        meta = current.metadata["langgraph"]
                        decoded = (tuple(meta["namespace"]), meta["key"])
                        self._hashed[sid] = decoded
            if decoded is not None:
                out[sid] = decoded
        return out

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = op.offset + op.limit
        if op.limit <= 0:
            return []
        if not op.query:
            found: list[Record] = []
            read: dict[str, Record | None] = {}
            for sid, (namespace, _) in self._items(read).items():
                if namespace[: len(prefix)] != prefix:
                    continue
                record = self._live(read[sid] if sid in read else self._current(sid))
                if record is not None and (not op.filter or _matches(record.content, op.filter)):
                    found.append(record)
            found.sort(key=lambda r: (r.event_time, r.id), reverse=True)
            return [self._hit(r) for r in found[op.offset : wanted]]
        k = min(_MAX_K, max(10, 4 * wanted))
        while True:
            answer = self.memory.recall(
                session_of(prefix, ""),
                op.query,
                k=k,
                scope="namespace",
                kinds=[ITEM_KIND],
                include_knowledge=False,
            )
            hits: list[SearchItem] = []
            seen: set[tuple[tuple[str, ...], str]] = set()
            for m in answer.memories:
                meta = m.metadata.get("langgraph") if isinstance(m.metadata, dict) else None
                if meta is None:
                    continue
                namespace, key = tuple(meta["namespace"]), meta["key"]
                if namespace[: len(prefix)] != prefix or (namespace, key) in seen:
                    continue
                if op.filter and not _matches(m.content, op.filter):
                    continue
                seen.add((namespace, key))
                hits.append(self._hit(m, m.score))
            if len(hits) >= wanted or len(answer.memories) < k or k == _MAX_K:
                return hits[op.offset : wanted]
            k = _MAX_K

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces: set[tuple[str, ...]] = set()
        read: dict[str, Record | None] = {}
        for sid, (namespace, _) in self._items(read).items():
            if op.match_conditions and not all(_condition(c, namespace) for c in op.match_conditions):
                continue
            if namespace in namespaces:
                continue
            if self._live(read[sid] if sid in read else self._current(sid)) is None:
                continue
            namespaces.add(namespace)
        if op.max_depth is not None:
            namespaces = {n[: op.max_depth] for n in namespaces}
        return sorted(namespaces)[op.offset : op.offset + op.limit]
