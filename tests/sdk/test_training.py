"""``sdk.private_training``: a run planned to a target epsilon, refused before any step when it
does not fit, with the training loss released alongside the gradients."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk
from dpnode.sdk._remote import remote_input

N, MOCK = 200, 20
C = 1.0


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 4)).astype(np.float32)
    return {"x": x, "label": (x[:, 0] + x[:, 1] > 1).astype(np.int64) + (x[:, 2] > 0.8)}


@pytest.fixture
def data(owner_client: sdk.Client, ds_client: sdk.Client) -> tuple[sdk.DatasetHandle, dict]:
    columns = _columns(N, 0)
    owner_client.upload_dataset(
        "points", columns, bounds={"x": (0.0, 1.0), "label": (0, 2)}, mock=_columns(MOCK, 1)
    )
    return ds_client.dataset("points"), columns


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _plan(model: torch.nn.Module, data: tuple, opt: Any = None, **options: Any) -> Any:
    """``sdk.private_training`` with this file's defaults (cross-entropy, epsilon 1, 3 steps,
    C, no bar), any of them overridden."""
    defaults = {
        "loss_fn": F.cross_entropy,
        "target_epsilon": 1.0,
        "steps": 3,
        "max_grad_norm": C,
        "progress": False,
    }
    opt = opt if opt is not None else torch.optim.SGD(model.parameters(), lr=0.1)
    return sdk.private_training(model, opt, data, **{**defaults, **options})


def test_a_run_spends_its_target_on_the_ledger_and_trains(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds, _ = data
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = ds.tensors("x", "label")
    adam = torch.optim.Adam(model.parameters(), lr=0.05)
    run = _plan(model, (x, y), adam, target_epsilon=2.0, steps=6)
    history = run.fit()
    assert [h.step for h in history] == list(range(1, 7))
    spent = ds_client.budget().spent_epsilon
    # the ledger's count, which the run reports, is at most the target and nearly all of it
    assert 2.0 * 0.995 <= spent <= 2.0
    assert run.epsilon == pytest.approx(spent, abs=1e-6)
    assert all(0 < a.epsilon < b.epsilon for a, b in itertools.pairwise(history))
    (line,) = ds_client.ledger()  # the run's six steps: one line, its total in epsilon terms
    assert (line.kind, line.steps, line.run_id) == ("run", 6, run.run.run_id)
    assert line.epsilon_used == pytest.approx(spent, abs=1e-8) == history[-1].receipt.run_epsilon
    for p, q in zip(model.parameters(), before, strict=True):
        assert not torch.equal(p.detach(), q)
    with pytest.raises(sdk.DPNodeError, match="all of its 6 steps"):
        run.step()


def test_a_bfloat16_model_trains_remotely_and_stays_bfloat16(
    data: tuple[sdk.DatasetHandle, dict], sqlite_only: None
) -> None:
    ds, _ = data
    model = _model().to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = ds.tensors("x", "label")
    history = _plan(model, (x.to(torch.bfloat16), y), steps=2).fit()
    assert len(history) == 2 and math.isfinite(history[-1].loss)
    for p, q in zip(model.parameters(), before, strict=True):
        assert p.dtype == torch.bfloat16 and not torch.equal(p.detach(), q)


def test_the_released_loss_is_the_clipped_mean_loss_plus_its_noise(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds, columns = data
    model = _model()
    local = _model()  # the same weights, to compute the true loss before the step
    x, y = ds.tensors("x", "label")
    bound, weight = 2.0, 0.25
    run = sdk.private_training(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        (x, y),
        loss_fn=F.cross_entropy,
        target_epsilon=8.0,
        steps=1,
        max_grad_norm=C,
        loss_bound=bound,
        loss_weight=weight,
        progress=False,
    )
    record = run.step()
    with torch.no_grad():
        losses = F.cross_entropy(
            local(torch.from_numpy(columns["x"])),
            torch.from_numpy(columns["label"]),
            reduction="none",
        )
    true = float(losses.clamp(0, bound).mean())
    scale = 2 * weight * C / bound
    sd = record.receipt.noise_scale / (scale * N)
    assert sd < 0.1 * true  # small enough that a wrong scale would show
    assert record.loss is not None and abs(record.loss - true) < 5 * sd
    # one release for the gradients (2C) and the loss (2C * weight), calibrated together
    joint = 2 * C * math.hypot(1.0, weight)
    assert joint <= record.receipt.sensitivity_l2 <= joint * 1.01


def test_a_run_that_does_not_fit_is_refused_before_any_step(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds, _ = data
    model = _model()
    remaining = ds_client.budget().remaining_epsilon
    x, y = ds.tensors("x", "label")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(sdk.BudgetExceededError, match="nothing was run or charged") as info:
        _plan(model, (x, y), opt, target_epsilon=remaining * 1.5, progress=True)
    assert info.value.rule is not None
    assert ds_client.ledger() == []
    delta = ds_client.budget().delta
    with pytest.raises(sdk.DPNodeError, match="allowance's delta"):
        _plan(model, (x, y), opt, target_delta=delta / 10)
    bad = [
        ({"steps": 0}, "steps must be a positive integer"),
        ({"max_grad_norm": math.nan}, "max_grad_norm"),
        ({"loss_bound": -1.0}, "loss_bound"),
        ({"loss_weight": 0.0}, "loss_weight"),
        ({"max_grad_norm": None}, "max_grad_norm"),
        ({"loss_bound": "10"}, "loss_bound"),
        ({"target_epsilon": 1e-12, "steps": 50}, "cannot pay for 50"),
        # Opacus's arguments: an epoch is one full-batch step; batches are not sampled
        ({"steps": None}, "pass steps="),
        ({"steps": None, "epochs": 0}, "epochs must be a positive integer"),
        ({"epochs": 4}, r"steps=3 and epochs=4 disagree"),
        ({"expected_batch_size": 64}, "full batches .* all 200 rows"),
    ]
    for change, message in bad:
        kwargs = {
            "loss_fn": F.cross_entropy,
            "target_epsilon": 1.0,
            "steps": 3,
            "max_grad_norm": C,
            **change,
        }
        with pytest.raises(sdk.DPNodeError, match=message):
            sdk.private_training(model, opt, (x, y), **kwargs)
    with pytest.raises(sdk.DPNodeError, match="two remote tensors"):
        _plan(model, (torch.zeros(3, 4), y), opt)
    assert ds_client.ledger() == []
    # said Opacus's way, the same run
    same = _plan(model, (x, y), opt, steps=None, epochs=3, expected_batch_size=x.shape[0])
    assert same.steps == 3 and same.plan == _plan(model, (x, y), opt).plan


def test_a_loss_that_is_not_per_row_is_refused_before_anything_is_published(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds, _ = data
    model = _model()
    x, y = ds.tensors("x", "label")
    run = _plan(model, (x, y), loss_fn=lambda out, target, reduction: F.cross_entropy(out, target))
    with pytest.raises(sdk.DPNodeError, match="one loss per row"):
        run.step()
    assert ds_client.ledger() == []


def test_a_loss_module_trains_as_its_function_does_and_a_loss_without_reduction_is_refused(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds, _ = data
    x, y = ds.tensors("x", "label")
    weight = torch.tensor([2.0, 1.0, 0.5])
    # Opacus's examples pass a criterion module: a copy of it gives the per-row losses
    criterion = torch.nn.CrossEntropyLoss(weight=weight)
    run = _plan(_model(), (x, y), loss_fn=criterion, steps=1)
    out, target = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    expected = F.cross_entropy(out, target, weight=weight, reduction="none")
    assert torch.equal(run.loss_fn(out, target), expected)
    assert criterion.reduction == "mean"  # the caller's module is left as it was
    (step,) = run.fit()
    assert math.isfinite(step.loss) and len(ds_client.ledger()) == 1
    # a callable without reduction=: refused when the run is made, nothing planned or charged
    lines = ds_client.ledger()
    for loss in (lambda out, t: F.cross_entropy(out, t), "cross_entropy"):
        with pytest.raises(sdk.DPNodeError, match=r"takes no reduction=|must be a torch loss"):
            _plan(_model(), (x, y), loss_fn=loss)
    assert ds_client.ledger() == lines


def test_the_progress_bar_shows_step_epsilon_and_loss_and_mock_mode_charges_nothing(
    data: tuple[sdk.DatasetHandle, dict],
    ds_client: sdk.Client,
    sqlite_only: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ds, _ = data
    model = _model()
    x, y = ds.tensors("x", "label")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _plan(model, (x, y), opt, steps=2, progress=True)
    run.fit()
    err = capsys.readouterr().err
    assert "private training" in err and "2/2" in err
    assert f"epsilon={run.epsilon:.3f}" in err and "loss=" in err
    with sdk.mock(ds):
        mx, my = ds.tensors("x", "label")  # the mock's rows stand in inside the block
        mocked = _plan(model, (mx, my), opt, steps=2).fit()
    assert all(h.receipt.mock for h in mocked) and len(mocked) == 2
    assert [line.steps for line in ds_client.ledger()] == [2]  # the mock run charged nothing
    capsys.readouterr()
    # left out, the bar follows the client's switch (sdk.login(progress=...))
    for switch in (False, True):
        ds_client.progress = switch
        _plan(model, (x, y), opt, steps=1, progress=None).fit()
        assert ("private training" in capsys.readouterr().err) is switch


LOSSES = {
    "cross_entropy": (lambda out, y, reduction: F.cross_entropy(out, y, reduction=reduction), 3),
    "cross_entropy_weighted_smoothed": (
        lambda out, y, reduction: F.cross_entropy(
            out, y, weight=torch.tensor([1.0, 2.0, 0.5]), label_smoothing=0.1, reduction=reduction
        ),
        3,
    ),
    "nll_loss": (
        lambda out, y, reduction: F.nll_loss(F.log_softmax(out, 1), y, reduction=reduction),
        3,
    ),
    "bce_with_logits": (
        lambda out, y, reduction: F.binary_cross_entropy_with_logits(
            out.squeeze(1), (y > 0).float(), pos_weight=torch.tensor(2.0), reduction=reduction
        ),
        1,
    ),
    "binary_cross_entropy": (
        lambda out, y, reduction: F.binary_cross_entropy(
            torch.sigmoid(out.squeeze(1)), (y > 0).float(), reduction=reduction
        ),
        1,
    ),
    "mse_loss": (
        lambda out, y, reduction: F.mse_loss(out.squeeze(1), y.float(), reduction=reduction),
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_each_standard_loss_trains_on_private_labels(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, sqlite_only: None, name: str
) -> None:
    ds, _ = data
    loss_fn, outputs = LOSSES[name]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, outputs)
    before = model.weight.detach().clone()
    x, y = ds.tensors("x", "label")
    sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    run = _plan(model, (x, y), sgd, loss_fn=loss_fn, target_epsilon=2.0, steps=2)
    history = run.fit()
    assert all(h.loss is not None and math.isfinite(h.loss) for h in history)
    # the gradients' 2C, and at most the loss's 2C * 0.25 besides (less where the public
    # weights and bounds keep every row's loss inside a narrower range than [0, 10])
    joint = 2 * C * math.hypot(1.0, 0.25)
    assert all(2 * C <= h.receipt.sensitivity_l2 <= joint * 1.01 for h in history), [
        h.receipt.sensitivity_l2 for h in history
    ]
    assert not torch.equal(model.weight.detach(), before)


def test_a_run_above_the_approval_threshold_waits_once_for_all_its_steps(
    data: tuple[sdk.DatasetHandle, dict],
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    ds, _ = data
    admin_client.set_policy("[approval]\nepsilon_above = 0.5\n", reason="runs need a look")
    model = _model()
    x, y = ds.tensors("x", "label")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        _plan(model, (x, y), opt, target_epsilon=2.0, steps=4)
    approval_id = waiting.value.approval_id
    assert approval_id is not None and waiting.value.rule == "approval.epsilon_above"
    message = str(waiting.value)
    assert f"approve request {approval_id}" in message and "Nothing was run" in message
    assert ds_client.ledger() == []
    (pending,) = admin_client.publish_approvals(status="pending")
    assert (pending.id, pending.kind, pending.steps, pending.steps_used) == (
        approval_id,
        "run",
        4,
        0,
    )
    assert pending.description == "private_training: 4 steps, target epsilon 2"
    assert pending.dataset_ids == (ds.id,)
    assert 2.0 * 0.99 <= pending.epsilon <= 2.0  # the run's total, as the ledger counts it
    admin_client.approve_publish(approval_id, reason="a reviewed model")

    run = _plan(model, (x, y), opt, target_epsilon=2.0, steps=4)
    assert run.run is not None and run.run.approval_id == approval_id
    run.fit()
    assert [(line.run_id, line.steps) for line in ds_client.ledger()] == [(run.run.run_id, 4)]
    assert 2.0 * 0.99 <= ds_client.budget().spent_epsilon <= 2.0
    (used,) = admin_client.publish_approvals()
    assert (used.status, used.steps_used) == ("used", 4)
    # A plain publish of one step's size is judged alone, and waits.
    assert run.plan.epsilon > 0.5
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(sdk.ApprovalRequiredError):
        sdk.publish_grads(model, epsilon=run.plan.epsilon, delta=run.plan.delta, max_grad_norm=C)


def test_a_run_carries_its_description_to_the_admin(
    data: tuple[sdk.DatasetHandle, dict],
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    ds, _ = data
    admin_client.set_policy("[approval]\nepsilon_above = 0.5\n", reason="runs need a look")
    why = "triage model <v2> for the ward"
    with pytest.raises(sdk.ApprovalRequiredError):
        _plan(_model(), ds.tensors("x", "label"), target_epsilon=2.0, description=why)
    (pending,) = admin_client.publish_approvals(status="pending")
    assert pending.description == f"private_training: 3 steps, target epsilon 2: {why}"
    assert why in str(pending)


def test_a_run_reads_the_datasets_the_node_reads(
    data: tuple[sdk.DatasetHandle, dict],
    owner_client: sdk.Client,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    # the node reads 'dataset:<id>/' with an id as JSON writes it: the run's '\d+' took
    # '٢' for 2 and '02' for 2, and planned the run as reading a dataset it does not read
    ds, _ = data
    other = owner_client.upload_dataset("other", {"v": np.ones(N)}, bounds={"v": (0, 1)})
    admin_client.set_policy("[approval]\nepsilon_above = 0.5\n", reason="runs need a look")
    x, y = ds.tensors("x", "label")
    arabic = str(other.id).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    for spelled in (arabic, f"0{other.id}"):
        stray = remote_input(f"dataset:{spelled}/v", (N, 1), torch.float32, origin=ds_client)
        with pytest.raises(sdk.ApprovalRequiredError) as waiting:
            _plan(_model(), (x + 0 * stray, y), target_epsilon=2.0)
        (pending,) = [
            a for a in admin_client.publish_approvals() if a.id == waiting.value.approval_id
        ]
        assert pending.dataset_ids == (ds.id,)


def test_a_denied_run_reports_the_admins_reason(
    data: tuple[sdk.DatasetHandle, dict],
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    ds, _ = data
    admin_client.set_policy("[approval]\nepsilon_above = 0.5\n", reason="runs need a look")
    x, y = ds.tensors("x", "label")
    model = _model()
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        _plan(model, (x, y), target_epsilon=2.0)
    assert waiting.value.approval_id is not None
    admin_client.deny_publish(waiting.value.approval_id, reason="try the mock data first")
    with pytest.raises(sdk.PolicyRefusedError, match="try the mock data first") as denied:
        _plan(model, (x, y), target_epsilon=2.0)
    assert denied.value.rule == "approval"
    assert ds_client.ledger() == []
