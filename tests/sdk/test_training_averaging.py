"""``sdk.private_training(..., average=...)``: the model left is an average of the run's
iterates, computed from what was released, so the run is charged exactly as without it."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.context import NodeContext
from tests.conftest import make_user
from tests.sdk.conftest import connect

N, STEPS, C = 120, 8, 1.0


class RecordingSGD(torch.optim.SGD):
    """SGD with momentum that keeps each iterate it steps to (every parameter, by name)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model.parameters(), lr=0.2, momentum=0.5)
        self.named = dict(model.named_parameters())
        self.iterates: list[dict[str, torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:
        out = super().step(closure)
        self.iterates.append({k: p.detach().clone() for k, p in self.named.items()})
        return out


@pytest.fixture
def points(owner_client: sdk.Client) -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (N, 4)).astype(np.float32)
    label = (x[:, 0] + x[:, 1] > 1).astype(np.int64)
    owner_client.upload_dataset(
        "points", {"x": x, "label": label}, bounds={"x": (0.0, 1.0), "label": (0, 1)}
    )


def _scientist(http: TestClient, context: NodeContext, name: str) -> sdk.Client:
    """A data scientist of their own, with a fresh allowance."""
    make_user(context, f"{name}@example.org", "data_scientist")
    return connect(http, f"{name}@example.org")


def _train(client: sdk.Client, average: Any, **options: Any) -> tuple[Any, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    x, y = client.dataset("points").tensors("x", "label")
    run = sdk.private_training(
        model,
        RecordingSGD(model),
        (x, y),
        loss_fn=F.cross_entropy,
        target_epsilon=2.0,
        steps=STEPS,
        max_grad_norm=C,
        progress=False,
        average=average,
        **options,
    )
    run.fit()
    return run, model


def _expected(average: str, iterates: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The average as docs/remote-tensors.md states it, from the iterates one by one."""
    if average == "tail":  # the mean of the last half
        tail = iterates[STEPS // 2 :]
        return {k: torch.stack([it[k] for it in tail]).mean(0) for k in iterates[0]}
    # an EMA over a quarter of the steps, a running mean until that window fills
    mean = dict(iterates[0])
    for t, it in enumerate(iterates[1:], start=2):
        decay = min(1 - 1 / (STEPS / 4), (t - 1) / t)
        mean = {k: decay * mean[k] + (1 - decay) * it[k] for k in mean}
    return mean


def test_an_averaged_run_is_charged_as_the_same_run_without_it_and_averages_its_iterates(
    points: None,
    http: TestClient,
    context: NodeContext,
    seed: Any,
    sqlite_only: None,
) -> None:
    runs = {}
    for average in (None, "ema", "tail"):
        client = _scientist(http, context, f"ds-{average}")
        seed(11)  # the same noise for each run: the same released gradients
        run, model = _train(client, average)
        runs[average] = (client, run, model)

    def charged(client: sdk.Client) -> list[tuple[Any, ...]]:
        return [
            (ln.kind, ln.steps, ln.mechanism, ln.epsilon_used, ln.delta_used, ln.epsilon, ln.rho)
            for ln in client.ledger()
        ]

    plain_client, plain, plain_model = runs[None]
    assert charged(plain_client) == [("run", STEPS, *charged(plain_client)[0][2:])]
    released = [(h.receipt.rho, h.receipt.noise_scale, h.epsilon) for h in plain.history]
    plain_opt: RecordingSGD = plain.optimizer
    iterates = plain_opt.iterates
    assert len(iterates) == STEPS
    # average=None: the parameters are the last iterate, as they always were
    assert plain.last_iterate is None
    for k, p in plain_model.named_parameters():
        assert torch.equal(p.detach(), iterates[-1][k])
    for average in ("ema", "tail"):
        client, run, model = runs[average]
        # the same charges, to the last digit, and the same releases
        assert charged(client) == charged(plain_client)
        assert client.budget().spent_epsilon == plain_client.budget().spent_epsilon
        assert [(h.receipt.rho, h.receipt.noise_scale, h.epsilon) for h in run.history] == released
        opt: RecordingSGD = run.optimizer
        # averaging never feeds back into the steps: the same iterates, the same momentum
        for mine, theirs in zip(opt.iterates, iterates, strict=True):
            assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
        params = zip(
            opt.param_groups[0]["params"], plain_opt.param_groups[0]["params"], strict=True
        )
        for p, q in params:
            assert torch.equal(
                opt.state[p]["momentum_buffer"], plain_opt.state[q]["momentum_buffer"]
            )
        assert opt.param_groups[0]["params"] == list(model.parameters())  # the same objects
        # the model holds the average; the last iterate is kept beside it
        assert run.last_iterate is not None
        want = _expected(average, iterates)
        for k, p in model.named_parameters():
            assert torch.equal(run.last_iterate[k], iterates[-1][k])
            torch.testing.assert_close(p.detach(), want[k], rtol=1e-6, atol=1e-7)
            assert not torch.equal(p.detach(), iterates[-1][k])
        model.load_state_dict(run.last_iterate, strict=False)
        assert all(torch.equal(p.detach(), iterates[-1][k]) for k, p in model.named_parameters())


def test_an_unknown_average_is_refused_before_anything_is_planned_or_charged(
    points: None, ds_client: sdk.Client, admin_client: sdk.Client, sqlite_only: None
) -> None:
    # a run planned on the node would wait for an approval: none is asked for
    admin_client.set_policy("[approval]\nepsilon_above = 0.5\n", reason="runs need a look")
    x, y = ds_client.dataset("points").tensors("x", "label")
    for bad in ("mean", "EMA", "", 1, True, ("ema",)):
        with pytest.raises(sdk.DPNodeError, match=r"average must be one of 'ema', 'tail' or None"):
            _train(ds_client, bad)
        with pytest.raises(sdk.DPNodeError, match=re.escape(f"got {bad!r}")):
            sdk.logistic_regression(x, y, epsilon=1.0, progress=False, average=bad)
    assert ds_client.ledger() == [] and admin_client.publish_approvals() == []
    assert ds_client.budget().spent_epsilon == 0


def test_logistic_regression_keeps_the_average_it_is_asked_for(
    points: None, ds_client: sdk.Client, sqlite_only: None
) -> None:
    x, y = ds_client.dataset("points").tensors("x", "label")
    fit = sdk.logistic_regression(x, y, epsilon=1.0, steps=6, progress=False, average="tail")
    assert fit.run.last_iterate is not None
    assert not torch.equal(fit.run.last_iterate["weight"], fit.run.model.weight.detach())
