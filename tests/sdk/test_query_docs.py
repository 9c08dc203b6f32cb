"""The examples of docs/statistics.md run, in order, against a real node (in process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpnode import sdk
from dpnode.node.db.models import User
from tests.sdk.query_table import upload

DOC = Path(__file__).resolve().parents[2] / "docs" / "statistics.md"


@pytest.mark.usefixtures("sqlite_only")
def test_statistics_examples_run(
    owner_client: sdk.Client,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    scientist: User,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin_client.grant_budget(scientist.email, epsilon=20.0, reason="the guide's examples")
    upload(owner_client, ds_client)
    monkeypatch.setattr(sdk, "login", lambda *a, **k: ds_client)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 9
    namespace: dict[str, object] = {"__name__": "docs"}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), namespace)
    result = namespace["result"]
    assert len(result) == 6  # type: ignore[arg-type]
    assert len(namespace["top"]) == 3  # type: ignore[arg-type]
    assert sorted(namespace["by_sex"]) == [0, 1]  # type: ignore[call-overload]
    assert [r["column"] for r in namespace["summary"].rows()] == ["sex", "age", "income", "hours"]  # type: ignore[attr-defined]
