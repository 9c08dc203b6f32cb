"""``sdk.private_training`` over one dataset split across three real nodes: each site releases
its own clipped gradient sum each step, charged to its own run; the client pools them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from dpnode import sdk
from tests.sdk.federation import Site

SPLIT = (150, 200, 250)
C = 5.0


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 4)).astype(np.float32)
    return {"x": x, "label": (x[:, 0] + x[:, 1] > 1).astype(np.int64) + (x[:, 2] > 0.8)}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _split(sites: list[Site]) -> dict[str, np.ndarray]:
    """One dataset, its rows split across the sites (same schema everywhere)."""
    pooled = _columns(sum(SPLIT), 0)
    start = 0
    for site, rows in zip(sites, SPLIT, strict=True):
        part = {k: v[start : start + rows] for k, v in pooled.items()}
        site.owner.upload_dataset("points", part, bounds={"x": (0.0, 1.0), "label": (0, 2)})
        start += rows
    return pooled


def _data(sites: list[Site]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    handles = sdk.federated([s.scientist.dataset("points") for s in sites]).handles
    return [ds.tensors("x", "label") for ds in handles]


def test_a_federated_step_is_the_pooled_gradient_within_the_sites_noise(
    sites: list[Site],
) -> None:
    pooled = _split(sites)
    for site in sites:
        site.admin.grant_budget("ds@example.org", epsilon=100.0, reason="a federated run")
    model, local = _model(), _model()
    x, y = torch.from_numpy(pooled["x"]), torch.from_numpy(pooled["label"])
    # the premise: no row's gradient reaches C, so the clipped sum is the plain sum
    norms = []
    for i in range(len(x)):
        local.zero_grad()
        F.cross_entropy(local(x[i : i + 1]), y[i : i + 1]).backward()
        norms.append(math.sqrt(sum(float(p.grad.square().sum()) for p in local.parameters())))
    assert max(norms) < C
    local.zero_grad()
    F.cross_entropy(local(x), y).backward()
    expected = [p.detach() - p.grad for p in local.parameters()]  # one SGD step, lr 1

    run = sdk.private_training(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _data(sites),
        loss_fn=F.cross_entropy,
        target_epsilon=15.0,
        steps=1,
        max_grad_norm=C,
        progress=False,
    )
    (record,) = run.fit()
    assert len(record.receipts) == 3 and record.receipt is record.receipts[0]
    # each coordinate's noise: the sites' independent Gaussians added, over the pooled rows
    sd = math.sqrt(sum(r.noise_scale**2 for r in record.receipts)) / sum(SPLIT)
    got = torch.cat([p.detach().flatten() for p in model.parameters()])
    want = torch.cat([e.flatten() for e in expected])
    assert sd < 0.05 * float(want.abs().max())  # small enough that a wrong pooling would show
    # every coordinate within z sd: a false failure has probability < 1e-5 over all of them
    z = stats.norm.isf(0.5e-5 / len(got))
    assert float((got - want).abs().max()) < z * sd
    assert record.loss is not None and math.isfinite(record.loss)


def test_each_site_is_charged_its_own_run_once_per_step(sites: list[Site]) -> None:
    _split(sites)
    model = _model()
    run = sdk.private_training(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        _data(sites),
        loss_fn=F.cross_entropy,
        target_epsilon=1.0,
        steps=3,
        max_grad_norm=1.0,
        progress=False,
    )
    before = [p.detach().clone() for p in model.parameters()]
    history = run.fit()
    assert [h.step for h in history] == [1, 2, 3]
    for k, site in enumerate(sites):
        planned = run.sites[k].run
        assert planned is not None
        (line,) = site.scientist.ledger()  # this site's run: one line, a charge per step
        assert (line.kind, line.steps, line.run_id) == ("run", 3, planned.run_id)
        assert [h.receipts[k].run_id for h in history] == [planned.run_id] * 3
        spent = site.scientist.budget().spent_epsilon
        assert 0.99 <= spent <= 1.0 and line.epsilon_used == pytest.approx(spent, abs=1e-8)
    assert run.epsilon == pytest.approx(max(s.scientist.budget().spent_epsilon for s in sites))
    assert any(
        not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True)
    )


def test_a_site_that_cannot_pay_refuses_the_run_before_any_site_plans_it(
    sites: list[Site],
) -> None:
    _split(sites)
    for site in sites[:2]:
        site.admin.grant_budget("ds@example.org", epsilon=100.0, reason="a federated run")
    poor = sites[2].scientist.budget().remaining_epsilon
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    options = {"loss_fn": F.cross_entropy, "steps": 3, "max_grad_norm": 1.0, "progress": False}
    with pytest.raises(sdk.BudgetExceededError, match=f"at {sites[2].url}.*nothing was run"):
        sdk.private_training(model, opt, _data(sites), target_epsilon=poor + 1.0, **options)
    for site in sites:
        assert site.scientist.ledger() == [] and site.scientist.budget().spent_epsilon == 0
    data = _data(sites)
    data[1] = (data[1][0][:, :3], data[1][1])  # one site's rows with other columns
    with pytest.raises(sdk.DPNodeError, match="site 1's rows differ from site 0's"):
        sdk.private_training(model, opt, data, target_epsilon=1.0, **options)
    with pytest.raises(sdk.DPNodeError, match="one per site"):
        sdk.private_training(
            model, opt, _data(sites), target_epsilon=1.0, subjects=[None], **options
        )
