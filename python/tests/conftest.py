"""Fixtures of the Python package's tests: a data directory opened in-process, and a real
``shadowbrain serve`` (the repository's binary, ``SHADOWBRAIN_BIN`` or target/debug) on
127.0.0.1 with a port the system chose, reached with ``Memory.connect``. Most tests run
against both, since both must answer the same."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import shadowbrain

REPO = Path(__file__).resolve().parents[2]

# The hash embedder: no model to load, the same vectors everywhere. The local model's
# own tests are the Rust suites'; these are about the package.
HASH_CONFIG = '[embedder]\nkind = "hash"\n'


def binary() -> Path:
    path = Path(os.environ.get("SHADOWBRAIN_BIN", REPO / "target" / "debug" / "shadowbrain"))
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `cargo build` (or set SHADOWBRAIN_BIN)")
    return path


class Server:
    """A ``shadowbrain serve`` child: its URL once it printed its ready line."""

    READY = re.compile(r"^shadowbrain: serving .* on (http://\S+)$")

    def __init__(self, data: Path, config: Path, env: dict[str, str] | None = None) -> None:
        self.data = data
        self.process = subprocess.Popen(
            [str(binary()), "serve", "--addr", "127.0.0.1:0", "--data", str(data), "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.said: list[str] = []
        found = threading.Event()
        self.url = ""

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.said.append(line.rstrip("\n"))
                match = self.READY.match(line.strip())
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(120) or not self.url:
            self.process.kill()
            raise AssertionError("serve did not print its ready line:\n" + "\n".join(self.said))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "shadowbrain.toml"
    path.write_text(HASH_CONFIG)
    return path


@pytest.fixture
def server(tmp_path: Path, config_file: Path) -> Iterator[Server]:
    s = Server(tmp_path / "served", config_file)
    yield s
    s.stop()


@pytest.fixture(params=["embedded", "client"])
def memory(request: pytest.FixtureRequest, tmp_path: Path, config_file: Path) -> Iterator[shadowbrain.Memory]:
    """A ``Memory``, embedded and as a client of a server: the same tests for both."""
    if request.param == "embedded":
        m = shadowbrain.Memory(tmp_path / "data", config=config_file)
        yield m
        m.close()
    else:
        s = Server(tmp_path / "served", config_file)
        m = shadowbrain.Memory.connect(s.url)
        yield m
        m.close()
        s.stop()
