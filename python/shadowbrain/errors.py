"""The errors shadowbrain raises: one class per kind of refusal, each carrying the
contract's ``code`` and ``message`` (the same words HTTP answers with, docs/http-api.md), so
code written against the embedded package handles a server's refusals the same way."""

from __future__ import annotations

import json
from typing import Any


class ShadowbrainError(Exception):
    """A refusal: ``code`` is the contract's (``invalid_k``, ``storage_full``, ...),
    ``message`` says what was wrong and how to fix it, ``status`` is the HTTP status the
    server answers it with (``None`` for a refusal that never reached it)."""

    code: str
    message: str
    status: int | None
    retry_after_ms: int | None

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after_ms = retry_after_ms


class InvalidRequest(ShadowbrainError):
    """The request was wrong (400, 413, 415, 422): a bad field, a body too large, an
    unknown kind. Fix it as the message says; sending it again as is fails again."""


class Unauthorized(ShadowbrainError):
    """No key, a wrong key (401), or a tenant key on a server-wide operation (403)."""


class NotFound(ShadowbrainError):
    """No such memory or recall in this namespace (404)."""


class Conflict(ShadowbrainError):
    """The request contradicts the state it meets (409)."""


class StorageFull(ShadowbrainError):
    """The disk holding the data directory is full (507): nothing of that write was
    stored; reads keep working and writes succeed again once space is freed."""


class Unavailable(ShadowbrainError):
    """The server cannot take it now (408, 429, 503): shutting down, overloaded, past its
    request timeout. Worth retrying, after ``retry_after_ms`` when given."""


class ConnectionFailed(ShadowbrainError):
    """The server could not be reached, or its answer was cut (``Memory.connect``)."""


class DirectoryInUse(ShadowbrainError):
    """Another process holds the data directory; the message names it."""


class Closed(ShadowbrainError):
    """The ``Memory`` was closed."""


def _class_for(status: int | None, code: str) -> type[ShadowbrainError]:
    if code == "directory_in_use":
        return DirectoryInUse
    if code == "closed":
        return Closed
    if code == "connection_failed":
        return ConnectionFailed
    if status is None and code.startswith("invalid_"):
        return InvalidRequest
    if status in (400, 413, 415, 422) or code == "bad_request":
        return InvalidRequest
    if status in (401, 403):
        return Unauthorized
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status == 507:
        return StorageFull
    if status in (408, 429, 503):
        return Unavailable
    return ShadowbrainError


def error_from(code: str, message: str, status: int | None = None) -> ShadowbrainError:
    """The error of the class ``code`` and ``status`` call for."""
    return _class_for(status, code)(code, message, status)


def from_answer(status: int, body: bytes) -> ShadowbrainError:
    """The error a refusing answer carries (``{"error":{"code","message"}}``)."""
    try:
        detail: Any = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
        retry = detail.get("retry_after_ms")
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:500]
        code, message, retry = "unexpected_answer", f"HTTP {status}: {text}", None
    error = _class_for(status, code)(code, message, status)
    error.retry_after_ms = retry
    return error


__all__ = [
    "ShadowbrainError",
    "InvalidRequest",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "StorageFull",
    "Unavailable",
    "ConnectionFailed",
    "DirectoryInUse",
    "Closed",
]
