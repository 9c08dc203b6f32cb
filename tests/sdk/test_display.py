"""Notebook views: escaped HTML tables, DataFrames, and the budget's plot, on the real app."""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser

import matplotlib
import numpy as np
import pytest

from dpnode import sdk
from tests.sdk.conftest import remote_dataset

matplotlib.use("Agg")  # no display in tests

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


class _Tags(HTMLParser):
    """The tags and text of a fragment: a script tag in it would be one of the tags."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def shown(html: str) -> tuple[set[str], str]:
    parsed = _Tags(html)
    assert parsed.tags <= {"div", "strong", "table", "thead", "tbody", "tr", "th", "td", "p", "pre"}
    return parsed.tags, " ".join(parsed.text)


def test_datasets_and_remote_tensors_show_their_public_metadata_escaped(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    owner_client.upload_dataset(
        "<script>alert(1)<\\script>",
        {"age": np.arange(20)},
        bounds={"age": (0, 120)},
        tags=["markup"],
        description="<b>bold</b> & more",
    )
    ds = ds_client.search(tags=["markup"])[0]
    html = ds._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;bold" in html
    _, text = shown(html)
    assert "shape (20, 1)" in text and "<b>bold</b> & more" in text and "markup" in text
    assert "age" in text and "0, 120" in text
    age = ds["age"].float().mean()
    _, text = shown(age._repr_html_())
    assert "torch.float32" in text and "values stay on the node" in text


def test_receipts_budgets_and_ledgers_as_tables_and_frames(
    owner_client: sdk.Client, ds_client: sdk.Client, admin_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    released = ds["age"].float().mean().publish(epsilon=0.5)
    _, text = shown(released.receipt._repr_html_())
    assert "charged epsilon 0.5" in text and "laplace" in text and "noise_scale" in text
    ds["bmi"].mean().publish(epsilon=0.25)
    budget = ds_client.budget()
    _, text = shown(budget._repr_html_())
    assert "0.75 of 10 spent, 9.25 remaining" in text and "remaining_epsilon" in text

    ledger = ds_client.ledger()
    assert isinstance(ledger, list) and len(ledger) == 2
    tags, text = shown(ledger._repr_html_())
    assert "thead" in tags and re.search(r"ledger\s+\(2\)", text) and "laplace" in text
    frame = ledger.to_pandas()
    assert list(frame["epsilon"]) == [0.25, 0.5] and "policy_revision" in frame.columns
    assert "_ledger" not in frame.columns and len(frame) == 2

    admin_client.grant_budget("ds@example.org", epsilon=1.0, reason="a <good> reason")
    grants = ds_client.grants()
    assert list(grants.to_pandas()["reason"]) == ["a <good> reason"]
    assert "a &lt;good&gt; reason" in grants._repr_html_()
    audit = admin_client.audit(action="budget.grant").to_pandas()
    assert list(audit["action"]) == ["budget.grant"] and audit["at"].notna().all()

    policy = admin_client.policy()
    tags, text = shown(policy._repr_html_())
    assert "pre" in tags and "built-in default" in text and policy.content_hash in text


def test_mock_data_to_pandas(owner_client: sdk.Client, ds_client: sdk.Client) -> None:
    mock = remote_dataset(owner_client, ds_client).mock()
    frame = mock.to_pandas()
    assert frame.shape == (30, 5) and list(frame.columns) == list(mock)
    np.testing.assert_array_equal(frame["age"].to_numpy(), mock["age"])
    assert frame["scan"].iloc[3].shape == (2, 3)  # a per-row shape: one array a row


def test_to_pandas_without_pandas_says_how_to_get_it(
    owner_client: sdk.Client, ds_client: sdk.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    mock = remote_dataset(owner_client, ds_client).mock()
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ImportError, match=r"needs pandas.*dpnode\[pandas\]"):
        mock.to_pandas()
    with pytest.raises(ImportError, match="needs pandas"):
        ds_client.ledger().to_pandas()


def test_budget_plot_draws_the_spending_against_the_allocation(
    owner_client: sdk.Client, ds_client: sdk.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    for epsilon in (0.5, 1.0, 0.25):
        ds["age"].float().mean().publish(epsilon=epsilon)
    budget = ds_client.budget()
    ax = budget.plot()
    spent, allocation = ax.lines
    assert list(spent.get_ydata()) == [0.0, 0.5, 1.5, 1.75, 1.75]
    assert list(allocation.get_ydata()) == [10.0, 10.0]
    assert "allocation (10)" in [t.get_text() for t in ax.get_legend().get_texts()]

    ds["bmi"].mean().publish(epsilon=0.5, delta=1e-7)  # Gaussian: a zCDP total, converted
    budget = ds_client.budget()
    ys = list(budget.plot().lines[0].get_ydata())
    assert ys == sorted(ys) and ys[-1] == budget.spent_epsilon
    assert ys[-2] == pytest.approx(budget.spent_epsilon, rel=1e-6)  # the node's conversion

    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"needs matplotlib.*dpnode\[plot\]"):
        budget.plot()
