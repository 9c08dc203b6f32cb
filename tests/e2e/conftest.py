"""A real ``dpnode serve`` process on loopback, restartable, on each database backend."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from dpnode.node.cli import main as cli_main
from dpnode.node.settings import get_settings
from tests.postgres import free_port

REPO = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, data_dir: Path, database_url: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = os.environ | {
            "DPNODE_DATA_DIR": str(data_dir),
            "DPNODE_DATABASE_URL": database_url,
            "DPNODE_ARGON2_MEMORY_KIB": "8192",
            "DPNODE_ARGON2_TIME_COST": "1",
            "PYTHONPATH": str(REPO),
        }
        self.log = data_dir.parent / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dpnode", "serve", "--port", str(self.port), *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.log.parent,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the node exited early:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError(f"the node did not become healthy:\n{self.log.read_text()}")

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return self.log.read_text()

    def cli(self, *args: str) -> str:
        """Run ``dpnode ARGS`` against this node's database and data folder; its output."""
        done = subprocess.run(
            [sys.executable, "-m", "dpnode", *args],
            env=self.env,
            capture_output=True,
            text=True,
            cwd=self.log.parent,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def cli_here(self, *argv: str) -> str:
        """``dpnode ARGV`` against this node's database and data folder like ``cli``, but run
        in this process (its output): a new Python imports the whole node first, seconds a
        call on a loaded machine, for a test's setup (tests/node/test_cli.py tests the
        commands as processes)."""
        node_settings = {
            name: value for name, value in self.env.items() if name.startswith("DPNODE_")
        }
        out = io.StringIO()
        with mock.patch.dict(os.environ, node_settings), contextlib.redirect_stdout(out):
            get_settings.cache_clear()
            try:
                assert cli_main(list(argv)) == 0, f"dpnode {' '.join(argv)} failed"
            finally:
                get_settings.cache_clear()
        return out.getvalue()

    def add_users(self, *users: tuple[str, str, str]) -> None:
        """``dpnode user add`` for each (email, role, password), run in this process."""
        for email, role, password in users:
            self.cli_here("user", "add", "--email", email, "--role", role, "--password", password)


@pytest.fixture
def server(tmp_path: Path, database_url: str) -> Iterator[Server]:
    node = Server(tmp_path / "data", database_url)
    node.start()
    yield node
    node.stop()


@pytest.fixture
def demo_server(tmp_path: Path, database_url: str) -> Iterator[Server]:
    node = Server(tmp_path / "data", database_url, "--demo")
    node.start()
    yield node
    node.stop()
