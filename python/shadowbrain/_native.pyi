"""The native module (Rust, PyO3): a data directory opened in this process."""

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
    def recall(self, namespace: str, session_id: str, body: bytes) -> tuple[int, bytes]: ...
    def record(
        self, namespace: str, session_id: str, body: bytes, key: str | None = None
    ) -> tuple[int, bytes]: ...
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
