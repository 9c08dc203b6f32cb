"""The list of prims in docs/prims.md is what scripts/prim_table.py generates from the registry."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from dpnode.core.engine import REGISTRY

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prim_table.py"


@pytest.mark.slow
def test_the_documented_prim_list_is_generated_from_the_registry() -> None:
    table = runpy.run_path(str(SCRIPT))
    doc = table["DOC"].read_text()
    generated = table["render"]()
    assert table["current"](doc) == generated, (
        "docs/prims.md's prim list is stale: run .venv/bin/python scripts/prim_table.py"
    )
    rows = [line for line in generated.splitlines() if line.startswith("| `")]
    assert len(rows) == len(REGISTRY)
    for name, d in REGISTRY.items():
        kind = "rule" if d.privacy == "rule" else "**public-only**"
        assert f"| `{name}` | {kind} |" in generated
    assert "| `argsort` | **public-only** | `argsort`," in generated
    assert "| `convolution_weight_grad` | **public-only** | gradient of " in generated
