"""``Memory``: shadowbrain from Python, embedded in-process (``Memory(path)``) or as a client
of a running server (``Memory.connect(url)``), with one set of methods named as the HTTP
API's verbs (docs/http-api.md, docs/python.md). ``AsyncMemory`` is the same for asyncio
code: each call runs on a worker thread, and the runtime releases the GIL while it works."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlencode

from . import _native, _transport
from ._types import (
    Edge,
    Exported,
    Graph,
    HistoryEntry,
    Imported,
    Recall,
    Record,
    Session,
    _build,
)
from .errors import ShadowbrainError, error_from, from_answer

Scope = Literal["session", "agent", "namespace"]
Outcome = Literal["success", "failure"]
Status = Literal["active", "pinned", "obsolete", "wrong"]
Resolution = Literal["keep", "dismiss", "reinstate"]
When = datetime | str

_DEFAULT_TIMEOUT = 30.0


_segment = _transport.segment


def _time(name: str, value: When | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise error_from(
                f"invalid_{name}",
                f"`{name}` is a datetime without a time zone; pass an aware one, such as "
                "datetime.now(timezone.utc)",
            )
        return value.isoformat()
    raise error_from(
        f"invalid_{name}",
        f"`{name}` is {type(value).__name__}; pass a datetime or an RFC 3339 string",
    )


def _shape(what: str, error: Exception) -> ShadowbrainError:
    return error_from(
        "unexpected_answer",
        f"the answer to {what} does not have the shape this package reads ({error!r}); is "
        "the server a different version of shadowbrain?",
    )


class Memory:
    """Long-term memory for agents.

    ``Memory(path)`` opens the data directory ``path`` in this process, as ``shadowbrain
    serve --data path`` would (the same runtime, policy and defaults; the local model when
    installed), in namespace ``namespace``. ``Memory.connect(url, api_key=...)`` talks to a
    running server instead, in the namespace of its key. Either way the methods, answers
    and errors are the same. Safe to share between threads. Use it as a context manager,
    or call ``close()``: an embedded ``Memory`` then drains and flushes as the server does
    on SIGTERM.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        policy: str | os.PathLike[str] | None = None,
        config: str | os.PathLike[str] | None = None,
        namespace: str = "default",
    ) -> None:
        self._transport: _transport.Transport = _transport.Embedded(
            path, policy, config, namespace
        )
        self._closed = False

    @classmethod
    def connect(
        cls, url: str, *, api_key: str | None = None, timeout: float = _DEFAULT_TIMEOUT
    ) -> Memory:
        """A client of the server at ``url`` (``http://127.0.0.1:7420``), with ``api_key``
        when the server requires keys; each request waits up to ``timeout`` seconds."""
        memory = cls.__new__(cls)
        memory._transport = _transport.Http(url, api_key, timeout)
        memory._closed = False
        return memory

    def in_namespace(self, namespace: str) -> Memory:
        """The same open data directory acting in ``namespace`` (embedded only: a client's
        namespace is its API key's). Both share one runtime; closing either closes both."""
        if not isinstance(self._transport, _transport.Embedded):
            raise error_from(
                "invalid_namespace",
                "a client acts in its API key's namespace; connect with that namespace's key",
            )
        view = Memory.__new__(Memory)
        view._transport = self._transport.in_namespace(namespace)
        view._closed = False
        return view

    @property
    def embedder(self) -> str | None:
        """Which embedder is in force and why (embedded only; ``None`` for a client)."""
        return getattr(self._transport, "embedder", None)

    def __repr__(self) -> str:
        return f"Memory({self._transport.describe()})"

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Embedded: drains and flushes, as ``serve`` does on SIGTERM, and releases the data
        directory. A client: closes its connections. Calls after it raise ``Closed``;
        closing again does nothing."""
        if not self._closed:
            self._closed = True
            self._transport.close()

    # The one place a request is sent and its answer read (`record` and `recall` send
    # theirs by the transport's shorter ways, and read them here too).
    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Any:
        status, answer = self._send(method, path, body, headers)
        return self._read(f"{method} {path}", status, answer)

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> tuple[int, bytes]:
        self._open()
        data = None if body is None else json.dumps(body).encode()
        return self._transport.call(method, path, data, list(headers))

    def _records(
        self, method: str, path: str, body: Any = None, field: str | None = None
    ) -> list[Record]:
        """The records of the answer to ``method path``: the list at ``field``, or the
        answer itself, one record."""
        status, answer = self._send(method, path, body)
        return _transport.parse(f"{method} {path}", lambda data: _native.records(data, field), status, answer)

    def _open(self) -> None:
        if self._closed:
            raise error_from(
                "closed", f"{self!r} was closed; open a new Memory to go on"
            )

    @staticmethod
    def _read(what: str, status: int, answer: bytes) -> Any:
        if status >= 400:
            raise from_answer(status, answer)
        try:
            return json.loads(answer)
        except ValueError as e:
            raise _shape(what, e) from None

    def record(
        self,
        session_id: str,
        events: Iterable[Mapping[str, Any]] | None = None,
        *,
        text: str | None = None,
        kind: str = "observation",
        agent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        content: Any = None,
        timestamp: When | None = None,
        importance: float | None = None,
        parent_id: str | None = None,
        pinned: bool = False,
        idempotency_key: str | None = None,
    ) -> list[str]:
        """Records what happened in ``session_id``: the ``events`` given (each a dict of the
        contract's event fields: ``kind``, ``text``, ``agent_id``, ``metadata``, ...; up to
        1000), or one event made of ``text`` and the keywords; ``pinned`` writes it pinned
        (it never fades). Answers the new ids once durable. Sent again with the same
        ``idempotency_key``, the write is stored once (over HTTP every call carries one,
        made up when none is given, so a write sent again after a dropped connection is
        stored once)."""
        if events is None:
            if text is None and content is None:
                raise error_from(
                    "invalid_event",
                    "nothing to record: pass `events`, or `text` (and `kind`) for one event",
                )
            event: dict[str, Any] = {"kind": kind}
            for name, value in (
                ("text", text),
                ("content", content),
                ("agent_id", agent_id),
                ("metadata", metadata),
                ("timestamp", _time("timestamp", timestamp)),
                ("importance", importance),
                ("parent_id", parent_id),
            ):
                if value is not None:
                    event[name] = value
            if pinned:
                event["pinned"] = True
            sent: list[Mapping[str, Any]] = [event]
        else:
            if text is not None or content is not None:
                raise error_from(
                    "invalid_event", "pass either `events` or `text`/`content`, not both"
                )
            sent = [_event(e) for e in events]
        self._open()
        ids = self._transport.record_plain(session_id, sent, idempotency_key)
        if ids is not None:
            return ids
        status, data = self._transport.record(
            session_id, json.dumps({"events": sent}).encode(), idempotency_key
        )
        answer = self._read(f"POST /v1/sessions/{session_id}/events", status, data)
        return list(answer["ids"])

    def recall(
        self,
        session_id: str,
        query: str,
        *,
        k: int = 10,
        scope: Scope = "session",
        agent_id: str | None = None,
        include_knowledge: bool = True,
        kinds: Sequence[str] | None = None,
        since: When | None = None,
        until: When | None = None,
        token_budget: int | None = None,
        include_superseded: bool | None = None,
    ) -> Recall:
        """What ``session_id`` should remember for ``query``: the ``k`` best memories of
        the ``scope`` (this session, the agent's sessions, or the whole namespace), with the
        knowledge pool unless ``include_knowledge`` is false, each explained; and
        ``context``, ready for a prompt."""
        # The shortest way through (embedded, straight into the native module): what runs
        # here is part of every recall's cost.
        if self._closed:
            self._open()
        return self._transport.recall(
            session_id,
            query,
            k,
            scope,
            agent_id,
            include_knowledge,
            kinds,
            None if since is None else _time("since", since),
            None if until is None else _time("until", until),
            token_budget,
            include_superseded,
        )

    def feedback(
        self,
        session_id: str,
        *,
        outcome: Outcome,
        recall_id: str | None = None,
        memory_ids: Sequence[str] | None = None,
    ) -> int:
        """Says whether what was recalled helped: ``outcome`` credits every memory of
        ``recall_id``, or the ``memory_ids`` given. Answers how many were updated."""
        body: dict[str, Any] = {"outcome": outcome}
        if recall_id is not None:
            body["recall_id"] = recall_id
        if memory_ids is not None:
            body["memory_ids"] = list(memory_ids)
        answer = self._call("POST", f"/v1/sessions/{_segment(session_id)}/feedback", body)
        return int(answer["updated"])

    def condense(self, session_id: str) -> str | None:
        """Condenses the session's recent events into one memory now; its id, or ``None``
        when there are too few events."""
        answer = self._call("POST", f"/v1/sessions/{_segment(session_id)}/condense")
        memory_id: str | None = answer["memory_id"]
        return memory_id

    def timeline(
        self, session_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[Record]:
        """The session's records, newest first (``limit`` 1..=1000); ``before``, the id of
        the last record of the previous page, gives the next page."""
        query: dict[str, str | int] = {"limit": limit}
        if before is not None:
            query["before"] = before
        path = f"/v1/sessions/{_segment(session_id)}/timeline?{urlencode(query)}"
        return self._records("GET", path, field="items")

    def sessions(self) -> list[Session]:
        """The namespace's sessions."""
        answer = self._call("GET", "/v1/sessions")
        try:
            return [_build(Session, s) for s in answer["sessions"]]
        except (KeyError, TypeError) as e:
            raise _shape("GET /v1/sessions", e) from None

    def get(self, memory_id: str) -> Record:
        """One record, with its place among the values of its fact (``chain``)."""
        return self._records("GET", f"/v1/memories/{_segment(memory_id)}")[0]

    def history(self, memory_id: str) -> list[HistoryEntry]:
        """A record's audit history, oldest first."""
        path = f"/v1/memories/{_segment(memory_id)}/history"
        answer = self._call("GET", path)
        try:
            return [_build(HistoryEntry, e) for e in answer["entries"]]
        except (KeyError, TypeError) as e:
            raise _shape(f"GET {path}", e) from None

    def mark(self, memory_id: str, status: Status, reason: str | None = None) -> Record:
        """Sets a record's status: ``pinned`` (never fades), ``obsolete``, ``wrong`` (never
        recalled again, counted once as a failure) or ``active``; ``reason`` is kept in
        its history."""
        body: dict[str, Any] = {"status": status}
        if reason is not None:
            body["reason"] = reason
        return self._records("PATCH", f"/v1/memories/{_segment(memory_id)}", body)[0]

    def resolve(self, memory_id: str, how: Resolution, reason: str | None = None) -> Record:
        """Settles a contradiction the record is in (``keep`` it, ``dismiss`` it), or undoes
        its supersession (``reinstate``)."""
        body: dict[str, Any] = {"resolve": how}
        if reason is not None:
            body["reason"] = reason
        return self._records("PATCH", f"/v1/memories/{_segment(memory_id)}", body)[0]

    def forget(self, memory_id: str) -> Record:
        """Archives a record (a soft delete: kept, with its history, never recalled)."""
        return self._records("DELETE", f"/v1/memories/{_segment(memory_id)}")[0]

    def knowledge_search(self, query: str, *, k: int = 10) -> Recall:
        """Searches the namespace's knowledge pool only: the lessons promoted from what
        every agent recorded."""
        path = "/v1/knowledge/search"
        status, answer = self._send("POST", path, {"query": query, "k": k})
        return _transport.parse(f"POST {path}", Recall.from_json, status, answer)

    def graph(self, around: str, *, depth: int = 2) -> Graph:
        """The knowledge graph around a record, ``depth`` links deep."""
        path = f"/v1/knowledge/graph?{urlencode({'around': around, 'depth': depth})}"
        status, answer = self._send("GET", path)
        what = f"GET {path}"
        nodes = _transport.parse(what, lambda data: _native.records(data, "nodes"), status, answer)
        try:
            edges = [
                Edge(from_=e["from"], to=e["to"], relation=e["relation"])
                for e in json.loads(answer)["edges"]
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise _shape(what, e) from None
        return Graph(nodes=nodes, edges=edges)

    def policy(self) -> dict[str, Any]:
        """The policy in force: ``{"name", "hash", "policy", "namespaces"}``."""
        answer: dict[str, Any] = self._call("GET", "/v1/policy")
        return answer

    def _directory(self, what: str) -> _transport.Embedded:
        if self._closed:
            raise error_from("closed", f"{self!r} was closed; open a new Memory to go on")
        if not isinstance(self._transport, _transport.Embedded):
            raise error_from(
                "not_embedded",
                f"{what} needs the data directory itself, which the server holds: stop it and "
                "run `shadowbrain export --data DIR --namespace NS --output FILE` (or "
                "`shadowbrain import --data DIR FILE`), or open the directory with "
                "Memory(path)",
            )
        return self._transport

    def export(self, path: str | os.PathLike[str]) -> Exported:
        """Writes this namespace's records (every tier and status, with their embeddings
        and histories), tombstones, quarantine entries and recalls to the file ``path``, in
        the format of ``shadowbrain export`` (JSON lines; written beside and renamed when
        complete). Embedded only."""
        transport = self._directory("export")
        return Exported(*transport.export(os.fspath(path)))

    def import_(self, path: str | os.PathLike[str]) -> Imported:
        """Reads a file ``export`` (or ``shadowbrain export``) wrote into the data
        directory, as ``shadowbrain import`` does: every id kept, nothing overwritten, what
        is already there skipped. The runtime is drained, the file imported and the runtime
        opened again; calls from other threads meanwhile wait. A bad line raises
        ``ShadowbrainError`` (code ``import_failed``) naming it; the lines before it stay
        imported, and running the same import again once it is fixed skips them. Embedded
        only."""
        transport = self._directory("import")
        imported, present, different, dangling, problems = transport.import_(os.fspath(path))
        return Imported(imported, present, different, dangling, problems)



def _event(event: Mapping[str, Any]) -> Mapping[str, Any]:
    # Most events are plain dicts with no datetime: sent as they are (only `json.dumps`
    # reads them), not copied.
    if type(event) is dict and not isinstance(event.get("timestamp"), datetime):
        return event
    if not isinstance(event, Mapping):
        raise error_from(
            "invalid_event",
            f"an event is a dict like {{'kind': 'observation', 'text': ...}}, not "
            f"{type(event).__name__}",
        )
    out = dict(event)
    stamp = out.get("timestamp")
    if isinstance(stamp, datetime):
        out["timestamp"] = _time("timestamp", stamp)
    return out


class AsyncMemory:
    """``Memory`` for asyncio code: the same constructor, methods and answers, awaited.
    Each call runs on a worker thread (``asyncio.to_thread``), so the event loop never
    waits on the runtime or the network."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        policy: str | os.PathLike[str] | None = None,
        config: str | os.PathLike[str] | None = None,
        namespace: str = "default",
    ) -> None:
        self.sync = Memory(path, policy=policy, config=config, namespace=namespace)

    @classmethod
    def connect(
        cls, url: str, *, api_key: str | None = None, timeout: float = _DEFAULT_TIMEOUT
    ) -> AsyncMemory:
        """A client of the server at ``url`` (see ``Memory.connect``)."""
        memory = cls.__new__(cls)
        memory.sync = Memory.connect(url, api_key=api_key, timeout=timeout)
        return memory

    @classmethod
    def wrap(cls, memory: Memory) -> AsyncMemory:
        """The async face of an open ``Memory`` (both share it)."""
        wrapped = cls.__new__(cls)
        wrapped.sync = memory
        return wrapped

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def record(
        self,
        session_id: str,
        events: Iterable[Mapping[str, Any]] | None = None,
        *,
        text: str | None = None,
        kind: str = "observation",
        agent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        content: Any = None,
        timestamp: When | None = None,
        importance: float | None = None,
        parent_id: str | None = None,
        pinned: bool = False,
        idempotency_key: str | None = None,
    ) -> list[str]:
        events = None if events is None else list(events)
        return await asyncio.to_thread(
            self.sync.record,
            session_id,
            events,
            text=text,
            kind=kind,
            agent_id=agent_id,
            metadata=metadata,
            content=content,
            timestamp=timestamp,
            importance=importance,
            parent_id=parent_id,
            pinned=pinned,
            idempotency_key=idempotency_key,
        )

    async def recall(
        self,
        session_id: str,
        query: str,
        *,
        k: int = 10,
        scope: Scope = "session",
        agent_id: str | None = None,
        include_knowledge: bool = True,
        kinds: Sequence[str] | None = None,
        since: When | None = None,
        until: When | None = None,
        token_budget: int | None = None,
        include_superseded: bool | None = None,
    ) -> Recall:
        return await asyncio.to_thread(
            self.sync.recall,
            session_id,
            query,
            k=k,
            scope=scope,
            agent_id=agent_id,
            include_knowledge=include_knowledge,
            kinds=kinds,
            since=since,
            until=until,
            token_budget=token_budget,
            include_superseded=include_superseded,
        )

    async def feedback(
        self,
        session_id: str,
        *,
        outcome: Outcome,
        recall_id: str | None = None,
        memory_ids: Sequence[str] | None = None,
    ) -> int:
        return await asyncio.to_thread(
            self.sync.feedback,
            session_id,
            outcome=outcome,
            recall_id=recall_id,
            memory_ids=memory_ids,
        )

    async def condense(self, session_id: str) -> str | None:
        return await asyncio.to_thread(self.sync.condense, session_id)

    async def timeline(
        self, session_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[Record]:
        return await asyncio.to_thread(self.sync.timeline, session_id, limit=limit, before=before)

    async def sessions(self) -> list[Session]:
        return await asyncio.to_thread(self.sync.sessions)

    async def get(self, memory_id: str) -> Record:
        return await asyncio.to_thread(self.sync.get, memory_id)

    async def history(self, memory_id: str) -> list[HistoryEntry]:
        return await asyncio.to_thread(self.sync.history, memory_id)

    async def mark(self, memory_id: str, status: Status, reason: str | None = None) -> Record:
        return await asyncio.to_thread(self.sync.mark, memory_id, status, reason)

    async def resolve(
        self, memory_id: str, how: Resolution, reason: str | None = None
    ) -> Record:
        return await asyncio.to_thread(self.sync.resolve, memory_id, how, reason)

    async def forget(self, memory_id: str) -> Record:
        return await asyncio.to_thread(self.sync.forget, memory_id)

    async def knowledge_search(self, query: str, *, k: int = 10) -> Recall:
        return await asyncio.to_thread(self.sync.knowledge_search, query, k=k)

    async def graph(self, around: str, *, depth: int = 2) -> Graph:
        return await asyncio.to_thread(self.sync.graph, around, depth=depth)

    async def policy(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.policy)

    async def export(self, path: str | os.PathLike[str]) -> Exported:
        return await asyncio.to_thread(self.sync.export, path)

    async def import_(self, path: str | os.PathLike[str]) -> Imported:
        return await asyncio.to_thread(self.sync.import_, path)
