"""The node computes with NumPy: serving it must never import torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from pathlib import Path
from starlette.testclient import TestClient
import dpnode.node.app
from dpnode.node.settings import Settings

data = Path(sys.argv[1])
data.mkdir(parents=True)
settings = Settings(data_dir=data, argon2_memory_kib=8192, argon2_time_cost=1)
with TestClient(dpnode.node.app.create_app(settings)) as http:
    assert http.get("/api/v1/health").json()["status"] == "ok"
    assert http.get("/api/v1/version").status_code == 200
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(",".join(loaded) or "none")
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_serving_the_node_never_imports_torch(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "data")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "none"
