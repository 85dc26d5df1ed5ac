"""The two ways a ``Memory`` reaches shadowbrain, behind one call: ``(method, path, body,
headers) -> (status, body)`` with the JSON of docs/http-api.md on both sides, and two
shorter ways for the calls an agent makes most (``record``; ``recall``, which answers its
``Recall``).

- ``Embedded``: a data directory opened in this process by the native module (the server's
  own router, no socket; the GIL is released while it works).
- ``Http``: a running ``shadowbrain serve``, over HTTP/1.1 with keep-alive (one connection
  per thread), the API key as a bearer token.

Everything above them (typed answers, errors) is written once, so both modes answer the
same objects and raise the same errors."""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from . import _native
from ._native import Recall
from .errors import ConnectionFailed, ShadowbrainError, error_from, from_answer

T = TypeVar("T")


class Transport(Protocol):
    """Sends one request of the contract and answers its status and body."""

    def call(
        self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> tuple[int, bytes]: ...

    def recall(
        self,
        session_id: str,
        query: str,
        k: int,
        scope: str,
        agent_id: str | None,
        include_knowledge: bool,
        kinds: Sequence[str] | None,
        since: str | None,
        until: str | None,
        token_budget: int | None,
        include_superseded: bool | None,
    ) -> Recall:
        """The answer's ``Recall`` (embedded: built from the runtime's answer, no JSON
        between), or the refusal raised; arguments that are ``None`` are left out."""
        ...

    def record(self, session_id: str, body: bytes, key: str | None) -> tuple[int, bytes]: ...

    def record_plain(
        self, session_id: str, events: list[Mapping[str, Any]], key: str | None
    ) -> list[str] | None:
        """The new ids, when the transport wrote ``events`` as they are (embedded, plain
        events, no key); ``None`` when they must be sent as JSON with ``record``."""
        ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


def segment(value: str) -> str:
    """``value`` as one path segment: any text stays one, and the server judges it
    (``invalid_session_id``)."""
    return urllib.parse.quote(str(value), safe="")


class Embedded:
    """A data directory opened in this process (``shadowbrain._native``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        policy: str | os.PathLike[str] | None,
        config: str | os.PathLike[str] | None,
        namespace: str,
    ) -> None:
        self._refused = _native.NativeError
        self.path = Path(path)
        self.namespace = namespace
        program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        holder = f"the Python process {os.getpid()} ({program}, shadowbrain.Memory)"
        try:
            self._native = _native.Native(
                str(self.path),
                None if policy is None else str(policy),
                None if config is None else str(config),
                holder,
            )
        except _native.NativeError as e:
            raise _error(e) from None
        self.embedder: str = self._native.embedder
        self.recall = functools.partial(self._native.recall, namespace)

    def call(
        self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> tuple[int, bytes]:
        try:
            return self._native.request(self.namespace, method, path, body, headers)
        except self._refused as e:
            raise _error(e) from None

    # The two calls an agent makes most, answered by the route's own work without the
    # router: the same answers, less time. A recall goes straight to the native module (its
    # arguments in, its objects out, its refusals raised there), with nothing of Python's
    # between: `recall` is the native method with the namespace bound.
    recall: Callable[..., Recall]

    def record(self, session_id: str, body: bytes, key: str | None) -> tuple[int, bytes]:
        # Without the caller's key, none: nothing between here and the runtime sends a
        # write twice, so a made-up key would protect nothing (and cost the write its
        # digest and a stored entry).
        try:
            return self._native.record(self.namespace, session_id, body, key)
        except self._refused as e:
            raise _error(e) from None

    def record_plain(
        self, session_id: str, events: list[Mapping[str, Any]], key: str | None
    ) -> list[str] | None:
        # Plain events (str, numbers and bools in the contract's fields) are read straight
        # into the runtime's: no JSON written here and parsed there. With a key, JSON: the
        # key's digest is of the request's bytes, the same however the write is sent.
        if key is not None:
            return None
        try:
            return self._native.record_plain(self.namespace, session_id, events)
        except self._refused as e:
            raise _error(e) from None

    def export(self, path: str) -> tuple[int, int, int, int]:
        try:
            return self._native.export(self.namespace, path)
        except self._refused as e:
            raise _error(e) from None

    def import_(self, path: str) -> tuple[int, int, list[str], list[str], str | None]:
        try:
            return self._native.import_(path)
        except self._refused as e:
            raise _error(e) from None

    def close(self) -> None:
        try:
            self._native.close()
        except self._refused as e:
            raise _error(e) from None

    def describe(self) -> str:
        return f"{self.path} (embedded, namespace {self.namespace!r})"

    def in_namespace(self, namespace: str) -> Embedded:
        """The same open directory, acting in ``namespace``."""
        view = object.__new__(Embedded)
        view.__dict__.update(self.__dict__)
        view.namespace = namespace
        view.recall = functools.partial(self._native.recall, namespace)
        return view


def parse(what: str, build: Callable[[bytes], T], status: int, answer: bytes) -> T:
    """The answer to ``what`` built by the native module (``Recall.from_json``, ...), or the
    error it says (a refusal, or an answer of another shape)."""
    if status >= 400:
        raise from_answer(status, answer)
    try:
        return build(answer)
    except ShadowbrainError as e:
        raise error_from(e.code, f"the answer to {what}: {e.message}") from None


def _dumps(body: dict[str, Any]) -> bytes:
    """``body`` as JSON, or ``invalid_<argument>`` naming what cannot be JSON (as the
    native module refuses it)."""
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError):
        for name, value in body.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as e:
                raise error_from(
                    f"invalid_{name}", f"`{name}` cannot be sent as JSON ({e})"
                ) from None
        raise


def _error(refusal: Exception) -> Exception:
    """The package's error for a refusal of the native module (args: code, message)."""
    code, message = refusal.args
    return error_from(code, message)


class Http:
    """A running ``shadowbrain serve`` at ``url``."""

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise error_from(
                "invalid_url",
                f"{url!r} is not a server's URL; pass one like 'http://127.0.0.1:7420'",
            )
        self.url = url.rstrip("/")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        self._base = parsed.path.rstrip("/")
        self._timeout = timeout
        self._auth = None if api_key is None else f"Bearer {api_key}"
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = kind(self._host, self._port, timeout=self._timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def call(
        self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> tuple[int, bytes]:
        sent = {"Accept": "application/json"}
        if body is not None:
            sent["Content-Type"] = "application/json"
        if self._auth is not None:
            sent["Authorization"] = self._auth
        sent.update(headers)
        # A kept-alive connection the server closed meanwhile (its idle timeout) fails
        # before any answer. Such a request is sent once more on a new connection when
        # sending it twice is harmless: a read, a recall, or a write with an
        # Idempotency-Key (which `Memory.record` always sends); anything else might have
        # arrived and is left to the caller.
        repeatable = (
            method == "GET"
            or "Idempotency-Key" in sent
            or path.endswith("/recall")
            or path.endswith("/knowledge/search")
        )
        for attempt in (1, 2):
            connection = self._connection()
            reused = getattr(self._local, "used", False)
            try:
                connection.request(method, self._base + path, body=body, headers=sent)
                answer = connection.getresponse()
                data = answer.read()
                self._local.used = True
                return answer.status, data
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                self._local.connection = None
                self._local.used = False
                disconnected = isinstance(
                    e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                )
                if attempt == 1 and reused and disconnected and repeatable:
                    continue
                if isinstance(e, socket.timeout):
                    what = f"no answer within {self._timeout} s"
                else:
                    what = str(e) or type(e).__name__
                raise ConnectionFailed(
                    "connection_failed",
                    f"{method} {self.url}{path}: {what}; is `shadowbrain serve` running there?",
                ) from None
        raise AssertionError("unreachable")

    def recall(
        self,
        session_id: str,
        query: str,
        k: int,
        scope: str,
        agent_id: str | None,
        include_knowledge: bool,
        kinds: Sequence[str] | None,
        since: str | None,
        until: str | None,
        token_budget: int | None,
        include_superseded: bool | None,
    ) -> Recall:
        body: dict[str, Any] = {
            "query": query,
            "k": k,
            "scope": scope,
            "include_knowledge": include_knowledge,
        }
        for name, value in (
            ("agent_id", agent_id),
            ("kinds", None if kinds is None else list(kinds)),
            ("since", since),
            ("until", until),
            ("token_budget", token_budget),
            ("include_superseded", include_superseded),
        ):
            if value is not None:
                body[name] = value
        path = f"/v1/sessions/{segment(session_id)}/recall"
        status, answer = self.call("POST", path, _dumps(body), [])
        return parse(f"POST {path}", _native.Recall.from_json, status, answer)

    def record(self, session_id: str, body: bytes, key: str | None) -> tuple[int, bytes]:
        # Always a key over HTTP (the caller's, or a fresh one): it is what makes sending
        # the write again after a dropped connection safe.
        path = f"/v1/sessions/{segment(session_id)}/events"
        key = key if key is not None else str(uuid.uuid4())
        return self.call("POST", path, body, [("Idempotency-Key", key)])

    def record_plain(
        self, session_id: str, events: list[Mapping[str, Any]], key: str | None
    ) -> list[str] | None:
        # Over HTTP every write is JSON.
        return None

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def describe(self) -> str:
        return self.url

