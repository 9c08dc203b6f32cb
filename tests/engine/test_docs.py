"""docs/prims.md documents every prim and its examples run."""

from __future__ import annotations

import re
from pathlib import Path

from dpnode.core.engine import PRIM_VERSION, REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "prims.md"


def test_every_prim_is_documented() -> None:
    text = DOC.read_text()
    words = set(re.findall(r"[a-z_0-9]+", text))
    missing = sorted(set(REGISTRY) - words)
    assert not missing, f"prims missing from docs/prims.md: {missing}"
    assert f"(version {PRIM_VERSION})" in text


def test_usage_example_runs() -> None:
    text = DOC.read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # our own doc, not client input
