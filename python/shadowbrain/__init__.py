"""shadowbrain: long-term memory for LLM agents.

``Memory(path)`` opens a data directory in this process (the same runtime, policies and
defaults as ``shadowbrain serve``); ``Memory.connect(url, api_key=...)`` talks to a running
server. Both have the same methods, named as the HTTP API's verbs (``record``, ``recall``,
``feedback``, ...), answer the same typed objects and raise the same ``ShadowbrainError``
subclasses. ``AsyncMemory`` is the same for asyncio. See docs/python.md.
"""

from ._memory import AsyncMemory, Memory
from ._types import (
    Chain,
    Edge,
    Exported,
    Graph,
    HistoryEntry,
    Imported,
    Passage,
    PolicyRef,
    Recall,
    Recalled,
    Record,
    Session,
    Utility,
    Why,
)
from .errors import (
    Closed,
    Conflict,
    ConnectionFailed,
    DirectoryInUse,
    InvalidRequest,
    NotFound,
    ShadowbrainError,
    StorageFull,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "AsyncMemory",
    "Chain",
    "Closed",
    "Conflict",
    "ConnectionFailed",
    "DirectoryInUse",
    "Edge",
    "Exported",
    "Graph",
    "HistoryEntry",
    "Imported",
    "InvalidRequest",
    "Memory",
    "NotFound",
    "Passage",
    "PolicyRef",
    "Recall",
    "Recalled",
    "Record",
    "Session",
    "ShadowbrainError",
    "StorageFull",
    "Unauthorized",
    "Unavailable",
    "Utility",
    "Why",
]
