"""Upload time and the node's peak memory: a chunked upload against one request.

Each measurement starts a fresh ``python -m dpnode serve`` on loopback (SQLite, its own
data directory), uploads one float64 column of N rows through the SDK, and reads the
node's peak resident memory (``VmHWM``) once the upload is registered. The baseline is
the one-request upload (``chunked=False``) measured in the same run; past
``DPNODE_MAX_UPLOAD_BYTES`` (512 MiB by default) the node refuses it, and
``--raise-limit`` lifts the limit to measure it anyway.

    python -m bench.upload                       # 10M and 100M rows
    python -m bench.upload --rows 10000000 --raise-limit
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpnode import sdk  # noqa: E402

PASSWORD = "a long bench password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(rows: int, *, chunked: bool, raise_limit: bool) -> tuple[str, float, float, float]:
    """(outcome, seconds, node's peak RSS MiB, node's RSS MiB before the upload)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {
            "DPNODE_DATA_DIR": tmp,
            "PYTHONPATH": str(ROOT),
            "DPNODE_ARGON2_MEMORY_KIB": "8192",
            "DPNODE_BLOB_CACHE_BYTES": "0",
        }
        if raise_limit:
            env["DPNODE_MAX_UPLOAD_BYTES"] = str(4 * 1024**3)
        python = sys.executable
        subprocess.run(
            [python, "-m", "dpnode", "user", "add", "--email", "o@example.org", "--role",
             "data_owner", "--password", PASSWORD],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        port = _free_port()
        node = subprocess.Popen(
            [python, "-m", "dpnode", "serve", "--port", str(port), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    httpx.get(url + "/api/v1/health", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            client = sdk.login(url, email="o@example.org", password=PASSWORD)
            client._http.timeout = httpx.Timeout(600.0)
            x = np.random.default_rng(0).uniform(0, 1, rows)
            before = _peak_rss_mib(node.pid)
            start = time.perf_counter()
            try:
                client.upload_dataset(
                    "x", {"x": x}, bounds={"x": (0, 1)}, chunked=chunked, progress=False
                )
                outcome = "ok"
            except sdk.DPNodeError as exc:
                outcome = f"refused ({exc.code})"
            seconds = time.perf_counter() - start
            return outcome, seconds, _peak_rss_mib(node.pid), before
        finally:
            node.terminate()
            node.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--raise-limit", action="store_true")
    args = parser.parse_args()
    print(f"{'rows':>12} {'path':<12} {'outcome':<28} {'seconds':>8} {'peak RSS MiB':>13}")
    for rows in args.rows:
        results = {}
        for chunked in (False, True):
            path = "chunked" if chunked else "one request"
            outcome, seconds, peak, before = measure(
                rows, chunked=chunked, raise_limit=args.raise_limit
            )
            results[chunked] = (outcome, seconds, peak)
            print(
                f"{rows:>12,} {path:<12} {outcome:<28} {seconds:>8.2f} {peak:>8.0f} "
                f"(idle {before:.0f})",
                flush=True,
            )
        if results[False][0] == "ok":
            one, chunk = results[False], results[True]
            print(
                f"{'':>12} chunked / one request: time {chunk[1] / one[1]:.2f}x, "
                f"peak RSS {chunk[2] / one[2]:.2f}x"
            )


if __name__ == "__main__":
    main()
