"""``torch.cov``/``torch.corrcoef`` of remote data: released from one clipped moment vector per
row (``dpnode/sdk/_moments.py``), the matrix computed after the noise."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.engine.evaluator import evaluate
from dpnode.node.db.models import User
from dpnode.sdk._moment_calls import swap_moments
from dpnode.sdk._moments import (
    VARIANCE_FLOOR,
    MomentPlan,
    Moments,
    moment_release,
    release_moments,
    weighted_plan,
)
from tests.sdk.conftest import cohort, connect, remote_dataset

N = 2000
BOUNDS = {"age": (17, 90), "hours": (1, 99), "income": (0.0, 250_000.0)}
FLOATS = {"a": (0.0, 10.0), "b": (-5.0, 5.0)}


def _people(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.integers(17, 91, N)
    hours = np.clip(np.round(rng.normal(40, 12, N)), 1, 99).astype(np.int64)
    income = np.clip(2500.0 * age + 500.0 * hours + rng.normal(0, 40_000, N), 0, 250_000)
    return {"age": age, "hours": hours, "income": income}


@pytest.fixture
def people(owner_client: sdk.Client, ds_client: sdk.Client) -> tuple[sdk.DatasetHandle, dict]:
    data = _people(0)
    owner_client.upload_dataset("people", data, bounds=BOUNDS)
    return ds_client.dataset("people"), data


def _stack(ds: sdk.DatasetHandle, *columns: str) -> torch.Tensor:
    return torch.stack([ds[c].to(torch.float64) for c in columns])


def _scaled(data: dict, columns: tuple[str, ...], bounds: dict) -> np.ndarray:
    lo = np.array([bounds[c][0] for c in columns], dtype=np.float64)
    hi = np.array([bounds[c][1] for c in columns], dtype=np.float64)
    x = np.stack([np.asarray(data[c], dtype=np.float64) for c in columns], axis=1)
    return (x - (lo + hi) / 2) / ((hi - lo) / 2)


def _vector(u: np.ndarray, plan: MomentPlan) -> np.ndarray:
    """Each row's moment vector, as the SDK lays it out (computed here, unclipped)."""
    k = plan.features
    pairs = plan.pairs()
    parts = [u * plan.first, (u[:, :k] ** 2 - 1) * plan.square]
    if pairs:
        parts.append(u[:, [i for i, _ in pairs]] * u[:, [j for _, j in pairs]] * plan.cross)
    return np.concatenate(parts, axis=1)


@pytest.mark.usefixtures("sqlite_only")
def test_cov_and_corrcoef_are_released_from_the_rows_moments(
    people: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, seed
) -> None:
    seed(1)  # a seeded noise stream: the correlation's and the variance's tails not computed
    ds, data = people
    x = _stack(ds, "age", "income")
    plan = weighted_plan(2, False, 1)
    cov = torch.cov(x)
    # the free answers and the receipt charge the moment vector: each row one vector of L1
    # norm at most plan.bound (3 unweighted for two columns), a replaced row moving it 2x that
    assert cov.sensitivity().l1 == pytest.approx(2 * plan.bound, rel=1e-6)
    released = cov.publish(epsilon=1.0)
    receipt = released.receipt
    assert receipt.mechanism == "laplace"
    assert receipt.sensitivity_l1 == pytest.approx(2 * plan.bound, rel=1e-6)
    assert receipt.noise_scale == pytest.approx(cov.noise_scale(epsilon=1.0))
    assert "torch.cov computed here from one release of the rows' moments" in str(receipt)
    assert released.shape == (2, 2) and released.dtype == torch.float64
    exact = np.cov(np.stack([data["age"], data["income"]]).astype(np.float64))
    # each entry's noise: a product's (scale b / c) and two sums' (b / a) times means in
    # [-1, 1], over n - 1, in the columns' units; 12 scales is far in Laplace's tail
    half = np.array([36.5, 125_000.0])
    allowed = 12 * receipt.noise_scale * (1 / plan.cross + 2 / plan.first) / (N - 1)
    assert np.all(np.abs(released.numpy() - exact) <= allowed * np.outer(half, half))
    assert torch.equal(released, released.T)
    corr = torch.corrcoef(x).publish(epsilon=1.0)
    assert corr.receipt.sensitivity_l1 == pytest.approx(2 * plan.bound, rel=1e-6)
    assert corr[0, 0] == corr[1, 1] == 1.0
    assert float(corr[0, 1]) == pytest.approx(
        np.corrcoef(data["age"], data["income"])[0, 1], abs=0.1
    )
    # the method forms, a correction, and one variable (torch.cov of a vector: its variance)
    biased = x.cov(correction=0).publish(epsilon=1.0)
    assert np.all(np.abs(biased.numpy() - exact * (N - 1) / N) <= allowed * np.outer(half, half))
    variance = torch.cov(ds["age"].float()).publish(epsilon=1.0)
    assert variance.shape == () and variance.dtype == torch.float32
    assert float(variance) == pytest.approx(data["age"].var(ddof=1), rel=0.05)
    assert len(ds_client.ledger()) == 4  # one publish each


@pytest.mark.usefixtures("sqlite_only")
def test_the_norm_is_chosen_for_the_least_noise(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    rng = np.random.default_rng(3)
    columns = {f"c{j}": rng.uniform(0, 1, 500) for j in range(8)}
    owner_client.upload_dataset("wide", columns, bounds={c: (0.0, 1.0) for c in columns})
    ds = ds_client.dataset("wide")
    few = torch.cov(_stack(ds, "c0", "c1")).publish(epsilon=1.0, delta=1e-6)
    # two columns: Laplace on the L1 norm noises less than the Gaussian at delta 1e-6, and a
    # Laplace release is pure epsilon: nothing of delta is spent
    assert few.receipt.mechanism == "laplace" and few.receipt.delta < 1e-12
    many = torch.corrcoef(_stack(ds, *columns)).publish(epsilon=1.0, delta=1e-6)
    plan = weighted_plan(8, False, 2)
    assert many.receipt.mechanism == "gaussian"
    assert many.receipt.sensitivity_l2 == pytest.approx(2 * plan.bound, rel=1e-6)
    assert many.shape == (8, 8)


@pytest.mark.usefixtures("sqlite_only")
def test_a_moment_release_sends_nothing_per_row(
    people: tuple[sdk.DatasetHandle, dict],
) -> None:
    """Every row is clipped on its own without a constant of the row indices in the graph
    (the node numbers the rows): the request does not grow with the rows."""
    ds, _ = people
    release = moment_release(_stack(ds, "age", "hours", "income").T, epsilon=1.0)
    graph = release.vector.graph()
    constants = [n.value for n in graph.nodes if n.op == "constant"]
    assert all(np.asarray(v).size < N for v in constants)
    assert any(n.op == "arange" and n.attrs["end"] == N for n in graph.nodes)
    vector = release.vector.publish(epsilon=1.0)
    assert release.finish(vector, vector.receipt).cov().shape == (3, 3)


@pytest.mark.usefixtures("sqlite_only")
def test_a_covariance_recorded_again_reuses_its_moment_vector_and_only_that(
    people: tuple[sdk.DatasetHandle, dict],
    owner_client: sdk.Client,
    http: TestClient,
    scientist: User,
) -> None:
    """The vector follows from the rows' graph, their public bounds and the plan: the same
    code recorded again gets the same vector; other columns, other values computed from
    them, another dataset or another session never get a kept one."""
    ds, data = people

    def vector(d: sdk.DatasetHandle, *columns: str, times: float = 1.0) -> torch.Tensor:
        rows = _stack(d, *columns) * times if times != 1.0 else _stack(d, *columns)
        return swap_moments([torch.cov(rows)], epsilon=1.0, delta=None).items[0]

    first = vector(ds, "age", "hours", "income")
    assert vector(ds, "age", "hours", "income") is first
    assert vector(ds, "age", "hours") is not first
    assert vector(ds, "age", "hours", "income", times=2.0) is not first
    wider = dict(BOUNDS, income=(0.0, 500_000.0))
    owner_client.upload_dataset("people_wider", data, bounds=wider)
    other = vector(connect(http, scientist.email).dataset("people_wider"), "age", "hours", "income")
    assert other is not first
    again = connect(http, scientist.email).dataset("people")
    assert vector(again, "age", "hours", "income") is not first  # another session's
    # each publish is its own release, charged on its own
    a = torch.cov(_stack(ds, "age", "hours", "income")).publish(epsilon=0.5)
    b = torch.cov(_stack(ds, "age", "hours", "income")).publish(epsilon=0.5)
    assert a.receipt.ledger_id != b.receipt.ledger_id
    assert a.receipt.noise_scale == b.receipt.noise_scale
    assert not torch.equal(a, b)  # noised twice


@pytest.mark.usefixtures("sqlite_only")
def test_a_replaced_row_moves_the_clipped_moments_within_the_charged_sensitivity(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    rng = np.random.default_rng(1)
    data = {"a": rng.uniform(0, 10, 50), "b": rng.uniform(-5, 5, 50)}
    owner_client.upload_dataset("floats", data, bounds=FLOATS)
    ds = ds_client.dataset("floats")
    for order, target in ((1, False), (2, False), (1, True), (2, True)):
        plan = weighted_plan(1 if target else 2, target, order)
        release = moment_release(
            _stack(ds, "a", "b").T, epsilon=1.0, delta=1e-6, target=target, plan=plan
        )
        charged = release.vector.sensitivity()
        charged_norm = charged.l1 if order == 1 else charged.l2
        assert charged_norm == pytest.approx(2 * plan.bound, rel=1e-6)
        graph = release.vector.graph()
        names = {name.rsplit("/", 1)[-1]: name for name in graph.input_names()}
        # the adversary's rows: the bounds' corners, the middle, and the points where a row's
        # vector is longest (the L1 norm peaks inside the box, at |u| = plan.first for these
        # weights), in every sign
        levels = sorted({-1.0, 1.0, 0.0, plan.first, -plan.first, 0.5, -0.5})
        candidates = [np.array(u) for u in itertools.product(levels, repeat=2)]
        vectors = []
        for u in candidates:
            neighbour = {c: data[c].copy() for c in data}
            for j, c in enumerate(("a", "b")):
                lo, hi = FLOATS[c]
                neighbour[c][0] = (lo + hi) / 2 + u[j] * (hi - lo) / 2
            inputs = {names[c]: neighbour[c] for c in data}
            released = evaluate(graph, inputs)[0]
            # the bound is exact: no row inside the bounds is clipped
            by_hand = _vector(_scaled(neighbour, ("a", "b"), FLOATS), plan).sum(axis=0)
            assert np.allclose(released, by_hand, rtol=1e-9, atol=1e-9)
            vectors.append(released)
        moves = [
            float(np.linalg.norm(v - w, ord=order)) for v, w in itertools.combinations(vectors, 2)
        ]
        assert max(moves) <= charged_norm * (1 + 1e-9)
        assert max(moves) >= 0.7 * charged_norm  # and the charge is not loose


@pytest.mark.usefixtures("sqlite_only")
def test_released_covariances_err_by_the_noise_the_receipt_states(
    people: tuple[sdk.DatasetHandle, dict], admin_client: sdk.Client
) -> None:
    admin_client.set_policy("[roles.data_scientist]\nepsilon = 1000.0\n", reason="releases")
    ds, data = people
    columns = ("age", "hours")
    x = _stack(ds, *columns)
    plan = weighted_plan(2, False, 1)
    # 300 releases: 30 publishes of 10 covariances each (each its own moment vector, noised
    # independently; the receipt's scale is the one every coordinate got)
    covs = [torch.cov(x) for _ in range(10)]
    released = [m for _ in range(30) for m in sdk.publish(covs, epsilon=10.0)]
    scale = released[0].receipt.noise_scale
    assert released[0].receipt.sensitivity_l1 == pytest.approx(10 * 2 * plan.bound, rel=1e-6)
    exact = np.cov(np.stack([data[c] for c in columns]).astype(np.float64))
    observed = np.mean([np.abs(m.numpy() - exact).mean() for m in released])
    # the same noise on the exact vector, decoded as the SDK decodes it
    u = _scaled(data, columns, BOUNDS)
    total = _vector(u, plan).sum(axis=0)
    rng = np.random.default_rng(0)
    draws = total + rng.laplace(0.0, scale, (20_000, total.size))
    sums = draws[:, :2] / plan.first
    squares = draws[:, 2:4] / plan.square + N
    product = draws[:, 4] / plan.cross
    half = np.array([(BOUNDS[c][1] - BOUNDS[c][0]) / 2 for c in columns])
    var = (squares - sums**2 / N) / (N - 1) * half**2
    cov = (product - sums[:, 0] * sums[:, 1] / N) / (N - 1) * half[0] * half[1]
    expected = np.mean(
        (np.abs(var - np.diag(exact)).sum(axis=1) + 2 * np.abs(cov - exact[0, 1])) / 4
    )
    assert observed == pytest.approx(expected, rel=0.15)


def test_corrcoef_is_within_minus_one_and_one_and_says_nothing_of_a_vanished_variance() -> None:
    plan = MomentPlan(3, False, 1)
    n = 100
    rng = np.random.default_rng(2)
    vanishings = 0
    for _ in range(200):  # noise far above the signal: the projection and the clip both act
        sums = torch.tensor(rng.normal(0, 30, 3))
        raw = rng.normal(0, 60, (3, 3))
        products = torch.tensor(raw + raw.T + n / 3 * np.eye(3))
        one = torch.ones(3, dtype=torch.float64)
        m = Moments(n, 0 * one, one, sums, products, plan, None)
        vanished = torch.diagonal(m.scaled_cov()) == 0
        vanishings += int(vanished.any())
        # with the release's noise known: finite, in [-1, 1], a vanished variable's
        # correlations 0 (the projection left it no covariance) and its own 1
        r = m.corrcoef(noise=5.0)
        assert bool(r.isfinite().all() and ((r >= -1) & (r <= 1)).all())
        assert torch.equal(torch.diagonal(r), torch.ones(3, dtype=torch.float64))
        off = r[vanished] - torch.eye(3, dtype=torch.float64)[vanished]
        assert bool((off.abs() < 1e-9).all())
        # without a noise to go by: NaN in its rows and columns, torch.corrcoef's constant
        plain = m.corrcoef(noise=0.0)
        finite = plain[plain.isfinite()]
        assert bool(((finite >= -1) & (finite <= 1)).all())
        assert bool(plain[vanished].isnan().all() and plain[:, vanished].isnan().all())
        assert bool(plain[~vanished][:, ~vanished].isfinite().all())
    assert vanishings >= 3  # the case is exercised (a fixed seed: 4 of the 200)
    # a variable whose noised variance is negative, beside one clearly varying
    sums = torch.zeros(2, dtype=torch.float64)
    products = torch.tensor([[-5.0, 0.0], [0.0, 50.0]], dtype=torch.float64)
    m = Moments(n, torch.zeros(2), torch.ones(2), sums, products, MomentPlan(2, False, 1), None)
    got = m.corrcoef()
    assert got[1, 1] == 1.0 and bool(got[0].isnan().all() and got[:, 0].isnan().all())
    assert torch.equal(m.corrcoef(noise=1.0), torch.eye(2, dtype=torch.float64))


def test_a_variance_below_its_noise_divides_its_correlations_no_lower_than_the_floor() -> None:
    n, noise = 100, 10.0
    plan = MomentPlan(2, False, 1)
    sums = torch.tensor([0.0, 20.0], dtype=torch.float64)
    products = torch.tensor([[0.5, 0.4], [0.4, 54.0]], dtype=torch.float64)
    m = Moments(n, torch.zeros(2), torch.ones(2), sums, products, plan, None)
    cov = m.scaled_cov()
    assert bool((torch.linalg.eigvalsh(cov) > 0).all())  # the projection leaves it as it is
    # the noise on each scaled variance: its square's, and its sum's through the mean
    sd = torch.tensor([noise, math.hypot(noise, 2 * 0.2 * noise)], dtype=torch.float64) / (n - 1)
    assert torch.allclose(m.variance_noise_sd(noise), sd)
    floor = VARIANCE_FLOOR * sd
    assert cov[0, 0] < floor[0] and cov[1, 1] > floor[1]  # the first within the noise
    r = m.corrcoef(noise=noise)
    assert float(r[0, 1]) == pytest.approx(float(cov[0, 1] / (floor[0] * cov[1, 1]).sqrt()))
    assert float(r[0, 0]) == float(r[1, 1]) == 1.0
    # without a noise to go by (no receipt), or with none, the variances divide as they are
    plain = float(cov[0, 1] / (cov[0, 0] * cov[1, 1]).sqrt())
    assert float(m.corrcoef()[0, 1]) == pytest.approx(plain)
    assert float(m.corrcoef(noise=0.0)[0, 1]) == pytest.approx(plain)
    assert abs(float(r[0, 1])) < abs(plain)


@pytest.mark.usefixtures("sqlite_only")
def test_the_floor_makes_correlations_within_the_noise_more_accurate_and_leaves_others_be(
    people: tuple[sdk.DatasetHandle, dict],
    owner_client: sdk.Client,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    seed,
) -> None:
    seed(2)  # a seeded noise stream: two means of 40 noisy errors compared, tail not computed
    admin_client.set_policy("[roles.data_scientist]\nepsilon = 1000.0\n", reason="releases")
    # 60 rows of four correlated columns at epsilon 1: the noise is of the variances' size
    rng = np.random.default_rng(5)
    latent = rng.normal(0, 1, (60, 1))
    values = np.clip(5 + 1.5 * (latent + rng.normal(0, 1, (60, 4))), 0, 10)
    small = {f"c{j}": values[:, j] for j in range(4)}
    owner_client.upload_dataset("small", small, bounds={c: (0.0, 10.0) for c in small})
    ds = ds_client.dataset("small")
    truth = np.corrcoef(values.T)[np.triu_indices(4, 1)]
    floored, plain = [], []
    for _ in range(40):
        m = release_moments(_stack(ds, *small).T, epsilon=1.0)
        for out, noise in ((floored, None), (plain, 0.0)):
            r = m.corrcoef(noise=noise).numpy()[np.triu_indices(4, 1)]
            out.append(np.abs(np.nan_to_num(r) - truth).mean())
    assert np.mean(floored) < 0.9 * np.mean(plain)
    # where the variances are far above their noise (2,000 rows), the floor changes nothing
    people_ds, _ = people
    m = release_moments(_stack(people_ds, "age", "hours", "income").T, epsilon=1.0)
    assert m.noise_sd() == pytest.approx(math.sqrt(2) * m.receipt.noise_scale)
    assert torch.equal(m.corrcoef(), m.corrcoef(noise=0.0))
    released = torch.corrcoef(_stack(people_ds, "age", "hours")).publish(epsilon=1.0)
    assert "2 standard deviations of its noise" in released.receipt.post_processing


@pytest.mark.usefixtures("sqlite_only")
def test_corrcoef_released_at_a_tiny_epsilon_stays_in_range(
    people: tuple[sdk.DatasetHandle, dict],
) -> None:
    ds, _ = people
    corr = torch.corrcoef(_stack(ds, "age", "hours", "income"))
    for _ in range(10):
        r = corr.publish(epsilon=0.001)
        finite = r[r.isfinite()]
        assert bool(((finite >= -1) & (finite <= 1)).all())


@pytest.mark.usefixtures("sqlite_only")
def test_a_column_without_finite_bounds_is_refused_by_name(
    people: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    ds, _ = people
    x = torch.stack([ds["age"].double(), torch.log(ds["hours"] - 1.0)])  # log(0): no lower end
    for call in (torch.cov, torch.corrcoef):
        with pytest.raises(sdk.PrivacyTrackingError, match=r"column 1 \(from 'hours'\)"):
            call(x).publish(epsilon=1.0)
    rows = torch.stack([ds["age"].double(), ds["hours"].double()], dim=1)
    with pytest.raises(sdk.PrivacyTrackingError, match=r"column 2 \(from 'hours'\)"):
        sdk.linear_regression(rows, torch.log(ds["hours"] - 1.0), epsilon=1.0)
    assert ds_client.ledger() == []  # nothing charged for a refusal


@pytest.mark.usefixtures("sqlite_only")
def test_what_is_computed_from_the_matrix_is_an_ordinary_graph(
    people: tuple[sdk.DatasetHandle, dict],
) -> None:
    ds, _ = people
    x = _stack(ds, "age", "hours")
    entry = torch.cov(x)[0, 1].publish(epsilon=1.0)  # the tracker's bound on torch's composite
    assert entry.receipt.post_processing is None
    with pytest.raises(sdk.PrivacyTrackingError, match="unbounded"):
        torch.corrcoef(x)[0, 1].publish(epsilon=1.0)
    changed = torch.cov(x)
    changed.mul_(2)  # no longer the covariance: published as what it now is
    assert changed.publish(epsilon=1.0).receipt.post_processing is None
    assert not math.isnan(float(torch.cov(x).publish(epsilon=1.0)[0, 0]))


@pytest.mark.usefixtures("sqlite_only")
def test_a_dry_run_on_mock_data_releases_the_mock_rows_moments(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    mock = cohort(30, 1)
    with sdk.mock(ds):
        cov = torch.cov(_stack(ds, "age", "bmi")).publish(epsilon=1e6)
    assert cov.receipt.mock and cov.receipt.post_processing is not None
    exact = np.cov(np.stack([mock["age"], mock["bmi"]]).astype(np.float64))
    assert np.allclose(cov.numpy(), exact, rtol=1e-3)
    assert ds_client.ledger() == []


@pytest.mark.usefixtures("sqlite_only")
def test_a_subjects_rows_are_clipped_together_when_the_subjects_are_given(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    rng = np.random.default_rng(4)
    data = {
        "person": np.repeat(np.arange(20), 3),  # three rows each
        "a": rng.uniform(0, 10, 60),
        "b": rng.uniform(-5, 5, 60),
    }
    owner_client.upload_dataset("visits", data, bounds=FLOATS, subject_id="person")
    ds = ds_client.dataset("visits")
    rows = _stack(ds, "a", "b").T
    plan = weighted_plan(2, False, 1)
    apart = moment_release(rows, epsilon=1.0, plan=plan).vector.sensitivity()
    together = moment_release(rows, epsilon=1.0, plan=plan, subjects=ds.subjects)
    # each row clipped on its own: a subject moves three vectors; summed first: one
    assert apart.l1 == pytest.approx(3 * 2 * plan.bound, rel=1e-6)
    assert together.vector.sensitivity().l1 == pytest.approx(2 * plan.bound, rel=1e-6)
