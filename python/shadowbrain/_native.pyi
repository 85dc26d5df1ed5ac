"""The native module (Rust, PyO3): a data directory opened in this process, and the
answers' objects."""

from collections.abc import Mapping, Sequence
from typing import Any

class NativeError(Exception):
    """A refusal: ``args`` is ``(code, message)``."""

class Native:
    def __init__(
        self,
        path: str,
        policy: str | None = None,
        config: str | None = None,
        holder: str = "a Python process",
    ) -> None: ...
    @property
    def embedder(self) -> str: ...
    def request(
        self,
        namespace: str,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: list[tuple[str, str]] = ...,
    ) -> tuple[int, bytes]: ...
    def recall(
        self,
        namespace: str,
        session_id: str,
        query: str,
        k: int | None = None,
        scope: str | None = None,
        agent_id: str | None = None,
        include_knowledge: bool | None = None,
        kinds: Sequence[str] | None = None,
        since: str | None = None,
        until: str | None = None,
        token_budget: int | None = None,
        include_superseded: bool | None = None,
    ) -> Recall:
        """A recall without the router; a refusal raises the package's error."""
    def record(
        self, namespace: str, session_id: str, body: bytes, key: str | None = None
    ) -> tuple[int, bytes]: ...
    def record_plain(
        self, namespace: str, session_id: str, events: list[Mapping[str, Any]]
    ) -> list[str] | None: ...
    def _facade_recall(
        self, namespace: str, session_id: str, query: str, k: int, repeats: int
    ) -> list[int]: ...
    def _facade_record(
        self, namespace: str, session_id: str, texts: list[str], batch: int
    ) -> list[int]: ...
    def _settle(self) -> None: ...
    def _embed(self, texts: list[str]) -> list[list[float]]: ...
    def export(self, namespace: str, path: str) -> tuple[int, int, int, int]: ...
    def import_(
        self, path: str
    ) -> tuple[int, int, list[str], list[str], str | None]: ...
    def close(self) -> None: ...

def records(answer: bytes, field: str | None = None) -> list[Record]:
    """The records of a server's JSON answer: the list at ``field``, or the answer itself."""

class PolicyRef:
    """The policy that ranked an answer or decided about a record."""

    @property
    def name(self) -> str: ...
    @property
    def hash(self) -> str:
        """The hex hash of its compiled form."""

class Utility:
    """Feedback counts: recalls that helped and that did not."""

    @property
    def successes(self) -> int: ...
    @property
    def failures(self) -> int: ...

class Chain:
    """A record's place among the values of its fact (on ``get``, ``mark``, ``resolve``,
    ``forget``)."""

    @property
    def supersedes(self) -> list[str]: ...
    @property
    def newer(self) -> list[str]:
        """The newer values after it, oldest first, ending with the current one."""
    @property
    def learned_at(self) -> int | None: ...
    @property
    def duplicate_of(self) -> str | None: ...

class Record:
    """A stored memory: every field of the contract's record. Compares by value, pickles,
    and ``to_dict()`` gives the contract's JSON as Python data."""

    @staticmethod
    def from_json(data: bytes) -> Record:
        """A record from the contract's JSON."""
    def to_dict(self) -> dict[str, Any]: ...
    @property
    def id(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def tier(self) -> str:
        """``episodic``, ``condensed`` or ``knowledge``."""
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def content(self) -> Any: ...
    @property
    def metadata(self) -> Any: ...
    @property
    def parent_id(self) -> str | None: ...
    @property
    def event_time(self) -> int:
        """When it happened, milliseconds since the epoch (``timestamp`` in RFC 3339)."""
    @property
    def timestamp(self) -> str: ...
    @property
    def recorded_time(self) -> int: ...
    @property
    def importance(self) -> float: ...
    @property
    def strength(self) -> float: ...
    @property
    def strength_at(self) -> int: ...
    @property
    def reinforcements(self) -> int: ...
    @property
    def utility(self) -> Utility: ...
    @property
    def status(self) -> str:
        """``active``, ``pinned``, ``obsolete``, ``archived`` or ``wrong``."""
    @property
    def status_at(self) -> int: ...
    @property
    def sources(self) -> list[str]: ...
    @property
    def policy(self) -> PolicyRef: ...
    @property
    def superseded_by(self) -> str | None: ...
    @property
    def valid_until(self) -> int | None: ...
    @property
    def conflicts(self) -> list[str]: ...
    @property
    def chain(self) -> Chain | None: ...

class Passage:
    """The passage of a long text that matched: byte offsets into ``text``."""

    @property
    def index(self) -> int: ...
    @property
    def of(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...

class Why:
    """The parts of a recalled memory's score, and what is known against it."""

    @property
    def relevance(self) -> float: ...
    @property
    def recency(self) -> float: ...
    @property
    def importance(self) -> float: ...
    @property
    def utility(self) -> float: ...
    @property
    def passage(self) -> Passage | None: ...
    @property
    def superseded_by(self) -> str | None: ...
    @property
    def valid_until(self) -> int | None: ...
    @property
    def conflicts_with(self) -> list[str]: ...

class Recalled(Record):
    """A recalled memory: the record, its score under the policy, and why."""

    @staticmethod
    def from_json(data: bytes) -> Recalled: ...
    @property
    def score(self) -> float: ...
    @property
    def why(self) -> Why: ...

class Recall:
    """A recall's answer: the memories best first, and ``context``, the same memories
    rendered for a prompt in time order within the token budget. Give ``recall_id`` to
    ``feedback`` to credit every memory of it."""

    @staticmethod
    def from_json(data: bytes) -> Recall: ...
    def to_dict(self) -> dict[str, Any]: ...
    @property
    def recall_id(self) -> str | None: ...
    @property
    def policy(self) -> PolicyRef: ...
    @property
    def memories(self) -> list[Recalled]:
        """Best first."""
    @property
    def context(self) -> str: ...
    @property
    def notes(self) -> list[str]:
        """What the answer went without and why (an unreachable embedder, say)."""
