"""What shadowbrain answers, as typed objects: a stored record, a recall and its ranked
memories with why each ranked where it did, a session, an audit entry, the knowledge graph.
Each is read from the contract's JSON (docs/http-api.md); fields a newer server adds are
ignored, so an older package keeps working against it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
class PolicyRef:
    """The policy that decided: its name and the hash of its compiled form."""

    name: str
    hash: str


@dataclass(slots=True, kw_only=True)
class Utility:
    """Feedback counts: recalls that helped and that did not."""

    successes: int
    failures: int


@dataclass(slots=True, kw_only=True)
class Chain:
    """A record's place among the values of its fact (on ``get`` and ``mark`` only)."""

    supersedes: list[str]
    newer: list[str]
    learned_at: int | None = None
    duplicate_of: str | None = None


@dataclass(slots=True, kw_only=True)
class Record:
    """A stored memory: every field, its status, strength, utility and sources."""

    id: str
    namespace: str
    session_id: str
    agent_id: str | None
    tier: str
    """``episodic``, ``condensed`` or ``knowledge``."""
    kind: str
    text: str
    content: Any
    metadata: Any
    parent_id: str | None
    event_time: int
    """When it happened, milliseconds since the epoch (``timestamp`` in RFC 3339)."""
    timestamp: str
    recorded_time: int
    importance: float
    strength: float
    strength_at: int
    reinforcements: int
    utility: Utility
    status: str
    """``active``, ``pinned``, ``obsolete``, ``archived`` or ``wrong``."""
    status_at: int
    sources: list[str]
    policy: PolicyRef
    superseded_by: str | None = None
    valid_until: int | None = None
    conflicts: list[str] = field(default_factory=list)
    chain: Chain | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        data = dict(data)
        _nested(data)
        return _build(cls, data)


def _nested(data: dict[str, Any]) -> None:
    data["utility"] = _build(Utility, data["utility"])
    data["policy"] = _build(PolicyRef, data["policy"])
    chain = data.get("chain")
    if chain is not None:
        data["chain"] = _build(Chain, chain)


@dataclass(slots=True, kw_only=True)
class Passage:
    """The passage of a long text that matched: byte offsets into ``text``."""

    index: int
    of: int
    start: int
    end: int


@dataclass(slots=True, kw_only=True)
class Why:
    """The parts of a recalled memory's score, and what is known against it."""

    relevance: float
    recency: float
    importance: float
    utility: float
    passage: Passage | None = None
    superseded_by: str | None = None
    valid_until: int | None = None
    conflicts_with: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Recalled(Record):
    """A recalled memory: the record, its score under the policy, and why."""

    score: float
    why: Why

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recalled:
        data = dict(data)
        _nested(data)
        why = dict(data["why"])
        passage = why.get("passage")
        if passage is not None:
            why["passage"] = _build(Passage, passage)
        data["why"] = _build(Why, why)
        return _build(cls, data)


@dataclass(slots=True, kw_only=True)
class Recall:
    """A recall's answer: the memories best first, and ``context``, the same memories
    rendered for a prompt in time order within the token budget. Give ``recall_id`` to
    ``feedback`` to credit every memory of it."""

    recall_id: str | None
    policy: PolicyRef
    memories: list[Recalled]
    context: str
    notes: list[str] = field(default_factory=list)
    """What the answer went without and why (an unreachable embedder, say)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recall:
        return cls(
            recall_id=data.get("recall_id"),
            policy=_build(PolicyRef, data["policy"]),
            memories=[Recalled.from_json(m) for m in data["memories"]],
            context=data["context"],
            notes=data.get("notes", []),
        )


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Graph:
        return cls(
            nodes=[Record.from_json(n) for n in data["nodes"]],
            edges=[Edge(from_=e["from"], to=e["to"], relation=e["relation"]) for e in data["edges"]],
        )


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
