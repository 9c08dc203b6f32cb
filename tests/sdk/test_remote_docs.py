"""The examples of docs/remote-tensors.md run, in order, against a real node (in process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpnode import sdk
from tests.sdk.conftest import remote_dataset

DOC = Path(__file__).resolve().parents[2] / "docs" / "remote-tensors.md"


@pytest.mark.usefixtures("sqlite_only")
def test_docs_examples_run(
    owner_client: sdk.Client, ds_client: sdk.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote_dataset(owner_client, ds_client)
    monkeypatch.setattr(sdk, "login", lambda *a, **k: ds_client)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "docs"}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), namespace)
    age = namespace["age"]
    assert repr(age).startswith(
        "RemoteTensor(shape=(40,), dtype=torch.int64, source=dataset 'cohort'"
    )
    assert repr(namespace["mean_age"]).endswith("ops=2)")
    # the statistics example: a histogram of 4 bins, a mean per sex, a fitted line
    assert namespace["ages"].shape == (4,)  # type: ignore[attr-defined]
    assert sorted(namespace["bmi_by_sex"]) == [0, 1]  # type: ignore[call-overload]
    assert namespace["fit"].coef.shape == (1,)  # type: ignore[attr-defined]
