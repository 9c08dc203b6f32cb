"""``sdk.federated``: one statistic over same-schema datasets on three real nodes, each with
its own database, ledger and policy; the parts combined in the client."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpnode import sdk
from tests.sdk.federation import Site

BOUNDS = {"age": (0, 120), "bmi": (10, 70)}
ROWS = (500, 800, 1200)


def _cohort(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "age": rng.integers(18, 90, n),
        "bmi": rng.uniform(15, 45, n).astype(np.float32),
    }


@pytest.fixture
def cohorts(sites: list[Site]) -> list[dict[str, np.ndarray]]:
    """Each site's owner uploads its own cohort under the same schema."""
    data = [_cohort(n, seed) for seed, n in enumerate(ROWS)]
    for site, columns in zip(sites, data, strict=True):
        site.owner.upload_dataset("cohort", columns, bounds=BOUNDS, tags=["health"])
    return data


def _handles(sites: list[Site]) -> list[sdk.DatasetHandle]:
    return [s.scientist.dataset("cohort") for s in sites]


def test_a_federated_mean_is_the_pooled_mean_within_the_noise_its_receipt_states(
    sites: list[Site], cohorts: list[dict[str, np.ndarray]]
) -> None:
    for site in sites:  # room for the releases below at every site
        site.admin.grant_budget("ds@example.org", epsilon=100.0, reason="a federated study")
    fed = sdk.federated(_handles(sites))
    pooled = np.concatenate([c["bmi"].astype(np.float64) for c in cohorts])
    assert fed.count() == len(pooled) == sum(ROWS)
    # noise far inside each sum's public range [10 n, 70 n] (over 10 sd from its ends), so
    # the node never clips a noised sum to that range, which would shrink the noise
    n, epsilon, delta = 200, 0.25, 1e-7
    errors, stated = [], set()
    for _ in range(n):
        result = fed.mean("bmi", epsilon=epsilon, delta=delta)
        errors.append(float(result.value) - pooled.mean())
        stated.add(result.receipt.noise_sd)
        assert all(p.receipt is not None and p.receipt.clipped == 0 for p in result.sites)
    (sd,) = stated  # the same release each time: the same stated noise
    # three independent Gaussians of the same sd (same bounds, same epsilon), over the rows
    site_sd = result.sites[0].noise_sd
    assert site_sd is not None and sd == pytest.approx(math.sqrt(3) * site_sd / sum(ROWS))
    e = np.asarray(errors)
    # The combined noise is Gaussian (a sum of Gaussians, the node's grid rounding far
    # below it), so mean(e) ~ N(0, sd^2 / n) and (n-1) var(e) / sd^2 ~ chi2(n-1) exactly.
    # Each check fails falsely with probability 5e-6 (two-sided), both at most 1e-5.
    z = stats.norm.isf(2.5e-6)
    assert abs(e.mean()) < z * sd / math.sqrt(n)
    low, high = stats.chi2.ppf([1.25e-6, 1 - 1.25e-6], n - 1) / (n - 1)
    assert low < e.var(ddof=1) / sd**2 < high
    # exactly one ledger row per site per publish, each the one its receipt names
    for site, part in zip(sites, result.sites, strict=True):
        entries = site.scientist.ledger_entries(limit=1000)
        assert len(entries) == n
        assert part.receipt is not None and entries[0].id == part.receipt.ledger_id


def test_a_site_without_the_budget_refuses_and_nothing_is_combined(
    sites: list[Site], cohorts: list[dict[str, np.ndarray]]
) -> None:
    poor = sites[2]
    for site in sites[:2]:
        site.admin.grant_budget("ds@example.org", epsilon=100.0, reason="a federated study")
    epsilon = poor.scientist.budget().remaining_epsilon + 1.0
    fed = sdk.federated(_handles(sites))
    with pytest.raises(sdk.FederatedError) as caught:
        fed.mean("age", epsilon=epsilon)
    error = caught.value
    assert [s.node for s in error.refused] == [poor.url]
    assert isinstance(error.refused[0].error, sdk.BudgetExceededError)
    assert poor.url in str(error) and "allow_partial=True" in str(error)
    # the parts that were released were charged at their sites, and the error carries them
    assert [s.node for s in error.released] == [s.url for s in sites[:2]]
    for site, part in zip(sites[:2], error.released, strict=True):
        (entry,) = site.scientist.ledger_entries()
        assert part.receipt is not None and entry.id == part.receipt.ledger_id
    assert len(poor.scientist.ledger_entries()) == 0
    assert poor.scientist.budget().spent_epsilon == 0

    partial = fed.mean("age", epsilon=epsilon, allow_partial=True)
    assert partial.receipt.partial and [s.node for s in partial.refused] == [poor.url]
    rows = ROWS[0] + ROWS[1]
    assert "partial" in str(partial.receipt).lower() and f"{rows} rows" in str(partial.receipt)
    html = partial.receipt._repr_html_()  # a notebook's table: a row per site, the refusal too
    assert all(s.url in html for s in sites) and "refused: " in html
    truth = np.concatenate([c["age"] for c in cohorts[:2]]).mean()
    sd = partial.receipt.noise_sd
    # a sum of Laplace noises tails off exponentially: beyond 20 sd with probability < 1e-8
    # (Chernoff, at lambda = 1 / (2 b) each Laplace's moment generating function is 4/3)
    assert sd is not None and abs(float(partial.value) - truth) < 20 * sd


def test_datasets_of_different_schemas_are_refused_before_anything_is_sent(
    sites: list[Site],
) -> None:
    wider = {**BOUNDS, "bmi": (10, 80)}
    for k, (site, bounds) in enumerate(zip(sites, (BOUNDS, BOUNDS, wider), strict=True)):
        site.owner.upload_dataset("cohort", _cohort(ROWS[k], k), bounds=bounds)
    with pytest.raises(sdk.DPNodeError, match=r"'bmi' has bounds \(10.0, 80.0\).*nothing was sent"):
        sdk.federated(_handles(sites))
    sites[1].owner.upload_dataset(
        "ages", {"age": _cohort(10, 5)["age"]}, bounds={"age": BOUNDS["age"]}
    )
    first, ages = sites[0].scientist.dataset("cohort"), sites[1].scientist.dataset("ages")
    with pytest.raises(sdk.DPNodeError, match=r"columns missing: \['bmi'\]"):
        sdk.federated([first, ages])
    with pytest.raises(sdk.DPNodeError, match="given twice"):
        sdk.federated([first, sites[0].scientist.dataset("cohort")])
    for site in sites:
        assert site.scientist.budget().spent_epsilon == 0


def test_several_outputs_add_output_by_output_and_a_combine_of_yours_is_kept(
    sites: list[Site], cohorts: list[dict[str, np.ndarray]]
) -> None:
    fed = sdk.federated(_handles(sites))
    both = fed.publish(lambda ds: [ds["age"].double().sum(), ds["bmi"].double().sum()], epsilon=1.0)
    ages, bmis = both.value
    sd = both.receipt.noise_sd
    # Laplace: each site's sd is sqrt(2) b, the combined sd the root of their squares' sum
    parts = [s.receipt for s in both.sites]
    assert all(r is not None and r.mechanism == "laplace" for r in parts)
    assert sd == pytest.approx(math.sqrt(sum(2 * r.noise_scale**2 for r in parts if r)))
    for value, column in ((ages, "age"), (bmis, "bmi")):
        truth = sum(float(c[column].astype(np.float64).sum()) for c in cohorts)
        assert abs(float(value) - truth) < 20 * sd  # P(fail) < 1e-8, as above
    largest = fed.publish(
        lambda ds: ds["age"].double().sum(), epsilon=1.0, combine=lambda parts: max(parts)
    )
    assert largest.receipt.noise_sd is None and "your function" in str(largest.receipt)
    assert float(largest.value) == max(float(s.value) for s in largest.sites)
    assert largest.receipt.epsilon == {(s.url, "cohort"): 1.0 for s in sites}


def test_the_examples_of_docs_federated_run_on_three_nodes(
    sites: list[Site], cohorts: list[dict[str, np.ndarray]]
) -> None:
    rng = np.random.default_rng(7)
    for site in sites:
        x = rng.uniform(0, 1, (60, 4)).astype(np.float32)
        points = {"x": x, "label": (x[:, 0] > 0.5).astype(np.int64)}
        site.owner.upload_dataset("points", points, bounds={"x": (0.0, 1.0), "label": (0, 2)})
    text = (Path(__file__).parents[2] / "docs" / "federated.md").read_text()
    login, *blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    # what the first block makes (the import, a login per node), made here by the fixture
    assert "from dpnode import sdk" in login and "sdk.login(url" in login
    namespace = {"sdk": sdk, "clients": [s.scientist for s in sites]}
    for block in blocks:
        exec(compile(block, "docs/federated.md", "exec"), namespace)  # our own docs' code
    assert isinstance(namespace["mean"], sdk.FederatedResult)
    assert len(namespace["history"]) == 3
    for site in sites:  # the statistics' three publishes and the run's line
        assert [line.kind for line in site.scientist.ledger()] == [
            "run",
            "charge",
            "charge",
            "charge",
        ]


def test_inside_mock_mode_every_site_dry_runs_on_its_mock_data_and_nothing_is_charged(
    sites: list[Site],
) -> None:
    for k, site in enumerate(sites):
        site.owner.upload_dataset(
            "cohort", _cohort(ROWS[k], k), bounds=BOUNDS, mock=_cohort(30 + k, 10 + k)
        )
    handles = _handles(sites)
    fed = sdk.federated(handles)
    with sdk.mock(*handles):
        dry = fed.mean("bmi", epsilon=1.0)  # each site's part in a thread of its own
    assert all(p.receipt is not None and p.receipt.mock for p in dry.sites)
    assert [p.rows for p in dry.sites] == [30, 31, 32]
    assert f"{30 + 31 + 32} rows" in str(dry.receipt)
    for site in sites:
        assert site.scientist.ledger_entries() == [] and site.scientist.budget().spent_epsilon == 0
