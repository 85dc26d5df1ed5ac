"""The two ways a ``Memory`` reaches shadowbrain, behind one call: ``(method, path, body,
headers) -> (status, body)`` with the JSON of docs/http-api.md on both sides.

- ``Embedded``: a data directory opened in this process by the native module (the server's
  own router, no socket; the GIL is released while it works).
- ``Http``: a running ``shadowbrain serve``, over HTTP/1.1 with keep-alive (one connection
  per thread), the API key as a bearer token.

Everything above them (typed answers, errors) is written once, so both modes answer the
same objects and raise the same errors."""

from __future__ import annotations

import http.client
import os
import socket
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import _native
from .errors import ConnectionFailed, error_from

if TYPE_CHECKING:
    from ._native import Recall


class Transport(Protocol):
    """Sends one request of the contract and answers its status and body."""

    def call(
        self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> tuple[int, bytes]: ...

    def recall(self, session_id: str, body: bytes) -> Recall | tuple[int, bytes]:
        """The answer's ``Recall`` (embedded: built from the runtime's answer, no JSON),
        or the status and body to read."""
        ...

    def record(self, session_id: str, body: bytes, key: str) -> tuple[int, bytes]: ...

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

    def call(
        self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]
    ) -> tuple[int, bytes]:
        try:
            return self._native.request(self.namespace, method, path, body, headers)
        except self._refused as e:
            raise _error(e) from None

    # The two calls an agent makes most, answered by the route's own work without the
    # router: the same answers, less time (a recall's as its objects, no JSON between).
    def recall(self, session_id: str, body: bytes) -> Recall | tuple[int, bytes]:
        try:
            return self._native.recall(self.namespace, session_id, body)
        except self._refused as e:
            raise _error(e) from None

    def record(self, session_id: str, body: bytes, key: str) -> tuple[int, bytes]:
        try:
            return self._native.record(self.namespace, session_id, body, key)
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
        return view


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

    def recall(self, session_id: str, body: bytes) -> tuple[int, bytes]:
        return self.call("POST", f"/v1/sessions/{segment(session_id)}/recall", body, [])

    def record(self, session_id: str, body: bytes, key: str) -> tuple[int, bytes]:
        path = f"/v1/sessions/{segment(session_id)}/events"
        return self.call("POST", path, body, [("Idempotency-Key", key)])

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def describe(self) -> str:
        return self.url

