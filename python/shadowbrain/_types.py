"""What shadowbrain answers, as typed objects: a stored record, a recall and its ranked
memories with why each ranked where it did, a session, an audit entry, the knowledge graph.
Fields a newer server adds are ignored, so an older package keeps working against it.

A record and a recall (with their parts) are the native module's classes over the
contract's own structs (python/src/answers.rs): embedded, a recall is handed over as the
runtime answered it, with no JSON between; a client reads a server's JSON into the same
classes. Each converts a field when it is read, compares by value, pickles, and gives the
contract's JSON as Python data with ``to_dict()``. The rest are dataclasses read from the
contract's JSON (docs/http-api.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from ._native import Chain, Passage, PolicyRef, Recall, Recalled, Record, Utility, Why

T = TypeVar("T")

_known: dict[type, frozenset[str]] = {}


def _build(cls: type[T], data: dict[str, Any]) -> T:
    """``cls(**data)``, leaving out keys ``cls`` does not know (a newer server's)."""
    try:
        return cls(**data)
    except TypeError:
        names = _known.get(cls)
        if names is None:
            names = _known[cls] = frozenset(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(slots=True, kw_only=True)
class Session:
    """A session of the namespace: how many events and memories it holds, and when it
    was last active (RFC 3339)."""

    session_id: str
    events: int
    memories: int
    last_active: str


@dataclass(slots=True, kw_only=True)
class HistoryEntry:
    """One line of a record's audit history."""

    at: str
    action: str
    by: str
    detail: str


@dataclass(slots=True, kw_only=True)
class Edge:
    """A link of the knowledge graph."""

    from_: str
    to: str
    relation: str


@dataclass(slots=True, kw_only=True)
class Graph:
    """The knowledge graph around a record: its records and the links between them."""

    nodes: list[Record]
    edges: list[Edge]


__all__ = [
    "Chain",
    "Edge",
    "Graph",
    "HistoryEntry",
    "Passage",
    "PolicyRef",
    "Recall",
    "Recalled",
    "Record",
    "Session",
    "Utility",
    "Why",
]


@dataclass(frozen=True)
class Exported:
    """What ``Memory.export`` wrote."""

    records: int
    purged: int
    quarantined: int
    recalls: int


@dataclass(frozen=True)
class Imported:
    """What ``Memory.import_`` did: lines ``imported``, lines already ``present`` (skipped),
    ids the directory holds in another state (``different``: its version kept), references
    to records in neither (``dangling``), and ``problems``, those two said as the CLI says
    them (``None`` when the file was imported whole)."""

    imported: int
    present: int
    different: list[str]
    dangling: list[str]
    problems: str | None
