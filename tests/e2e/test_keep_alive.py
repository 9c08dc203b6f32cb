"""An idle connection outlives a client's reuse of it: the node's keep-alive is its setting,
longer by default than httpx (the SDK's client) keeps an idle connection."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from dpnode.node.settings import Settings
from tests.e2e.conftest import Server

HEALTH = b"GET /api/v1/health HTTP/1.1\r\nHost: node\r\n\r\n"


def _answer(sock: socket.socket) -> bytes:
    """One response: its head, then as many body bytes as its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before an answer")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the node closes the connection within ``within`` seconds (an EOF)."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    finally:
        sock.settimeout(10)


def test_the_default_outlives_the_sdks_idle_connections() -> None:
    assert Settings().keep_alive_seconds > httpx.Limits().keepalive_expiry + 5


def test_an_idle_connection_is_kept_for_the_setting_then_closed(tmp_path: Path) -> None:
    node = Server(tmp_path / "data", f"sqlite:///{tmp_path}/node.sqlite3")
    node.env["DPNODE_KEEP_ALIVE_SECONDS"] = "3"
    node.start()
    try:
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
            sock.sendall(HEALTH)
            assert _answer(sock).startswith(b"HTTP/1.1 200")
            assert not _closed(sock, within=1.5)  # idle 1.5 s: still open, and reused
            sock.sendall(HEALTH)
            assert _answer(sock).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert _closed(sock, within=10)  # then closed by the node, after about 3 s
            assert 2.5 < time.monotonic() - started < 4.5  # uvicorn's own default: 5 s
    finally:
        node.stop()
