"""A private training run in the terms of Opacus: a target epsilon, a number of steps, a bar.

``sdk.private_training(model, optimizer, (X, y), loss_fn=F.cross_entropy,
target_epsilon=1.0, steps=40, max_grad_norm=1.0).fit()`` trains ``model`` on remote
tensors with DP gradient descent: every step computes the loss on all the rows, records each
row's gradient, and publishes their clipped sum with Gaussian noise
(:func:`sdk.publish_grads`); the optimizer then steps on the noised gradient, locally.

Before the first step the run is planned as a whole: the per-step noise comes from
:func:`sdk.step_budget`, the largest per-step epsilon whose ``steps`` releases the node's
privacy filter counts as at most ``target_epsilon``, and the run is refused *before any
step* when that does not fit what is left of your allowance. A run therefore never stops
half-way for want of budget (a concurrent publish of yours, or a policy change, aside).

The plan is then sent to the node (``client.plan_run``), whose policy judges the run as a
whole: its total against your budget and every dataset's cap, each step against the
per-publish caps, and its total against the admins' approval thresholds. A run above a
threshold waits for one admin approval of the whole run, raised as
:class:`~sdk.ApprovalRequiredError` before any step; once approved, the same call plans it
again and each step's publish names the run, so that its steps go through under that one
approval (and no more than its steps).

The bar shows the step, the run's epsilon as the ledger counts it (read from each step's
receipt) and the training loss. The loss is private too: each step releases it with the
gradients, in the same publish, as the mean of each row's loss clipped to ``[0,
loss_bound]``, scaled so that its sensitivity is ``loss_weight`` times the gradients'
(``2C``). The noise is calibrated to both together, which costs the gradients
``sqrt(1 + loss_weight²)`` times the noise (3% at the default 0.25); ``loss_bound=None``
releases no loss. The loss shown is a moving average of the released values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpnode.core.inputs import INPUT
from dpnode.sdk._budget import TrainingRunPlan
from dpnode.sdk._client import _wants_progress
from dpnode.sdk._exceptions import (
    ApprovalRequiredError,
    BudgetExceededError,
    DPNodeError,
    PolicyRefusedError,
)
from dpnode.sdk._publish import Receipt, publish_grads_with
from dpnode.sdk._remote import RemoteTensor, active_session, graph_for
from dpnode.sdk._steps import step_budget

__all__ = ["PrivateTraining", "TrainingStep", "private_training"]

#: weight of the last released loss in the bar's moving average
_SMOOTHING = 0.3


@dataclass(frozen=True)
class TrainingStep:
    """One step of a run: its number (from 1), the released mean loss (None if not
    tracked), the run's epsilon so far as the node's ledger counts it, and the receipt."""

    step: int
    loss: float | None
    epsilon: float
    receipt: Receipt


class PrivateTraining:
    """A private training run of ``model`` on remote ``data`` to ``target_epsilon``.

    Each step is full-batch DP gradient descent: the loss on every row, each subject's
    gradient clipped to ``max_grad_norm``, their sum released with Gaussian noise, then an
    ordinary ``optimizer.step()`` on the noised gradient. Call ``.fit()`` to take every
    step with a progress bar, or iterate over the run (one :class:`TrainingStep` each).

    Args:
        model, optimizer: ordinary torch objects; the model's layers need per-example
            gradients (every layer Opacus supports has them: ``docs/remote-tensors.md``).
        data: ``(inputs, targets)``, remote tensors with one row per example.
        loss_fn: a torch loss taking ``reduction=`` (``F.cross_entropy``,
            ``F.binary_cross_entropy_with_logits``, ``F.mse_loss``, ...), called as
            ``loss_fn(model(inputs), targets, reduction="none")``.
        target_epsilon: what the whole run may cost, as the node's ledger counts it.
        steps: how many steps (each one uses every row: a step is an epoch).
        epochs: Opacus's name for it: with full batches an epoch is one step, so
            ``epochs=30`` is ``steps=30`` (give one of the two).
        expected_batch_size: Opacus's batch size: the node trains with full batches, so
            only the row count is accepted (anything else is refused with the reason).
        max_grad_norm: ``C``, the clipping bound of each subject's gradient.
        target_delta: your allowance's delta, where the node counts every release; leave it
            out to use it, a different value is refused.
        loss_bound: each row's loss is clipped to ``[0, loss_bound]`` for the released
            training loss; ``None`` releases no loss.
        loss_weight: the loss's share of the noise, as a fraction of the gradients'
            sensitivity.
        subjects: which rows belong to one subject (see :func:`sdk.publish_grads`).
        progress: show a progress bar (step, epsilon, loss); by default as the client's
            ``progress`` says (``sdk.login(progress=...)``: in a terminal or a notebook).
        client: the node session (default: the one the data came from).
        description: what the run is for, in your words: an admin approving the run reads
            it (at most 400 characters).

    Raises:
        BudgetExceededError: the run does not fit what is left of your allowance (or a
            dataset's cap); nothing is run or charged.
        ApprovalRequiredError: the run's total is above the policy's approval threshold;
            ``approval_id`` names the request an admin answers. Nothing is run or charged:
            call ``private_training`` again with the same arguments once it is approved.
        PolicyRefusedError: a step is over the per-publish cap, or an admin denied the run
            (the message quotes the admin's reason).
        DPNodeError: invalid arguments, or too many steps for ``target_epsilon``.

    Attributes:
        plan: the per-step privacy parameters (``epsilon``, ``delta``) each publish uses.
        run: the run as the node planned it (its total, its ``run_id``); ``None`` in mock
            mode.
        history: the steps taken so far.

    Nothing is computed or charged until the run steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Sequence[torch.Tensor],
        *,
        loss_fn: Callable[..., torch.Tensor],
        target_epsilon: float,
        steps: int | None = None,
        max_grad_norm: float,
        target_delta: float | None = None,
        epochs: int | None = None,
        expected_batch_size: int | None = None,
        loss_bound: float | None = 10.0,
        loss_weight: float = 0.25,
        subjects: Any = None,
        progress: bool | None = None,
        client: Any = None,
        description: str = "",
    ) -> None:
        inputs, targets = data if len(data) == 2 else (None, None)
        steps = _steps(steps, epochs, expected_batch_size, inputs)
        if not (isinstance(inputs, RemoteTensor) and isinstance(targets, RemoteTensor)):
            raise DPNodeError(
                "data must be (inputs, targets), two remote tensors with the same rows: "
                "e.g. ds.tensors('features', 'label')"
            )
        if inputs.shape[0] != targets.shape[0]:
            raise DPNodeError(
                f"inputs have {inputs.shape[0]} rows but targets {targets.shape[0]}: "
                "each row is one example"
            )
        _check_positive("max_grad_norm", max_grad_norm)
        _check_positive("loss_weight", loss_weight)
        if loss_bound is not None:
            _check_positive("loss_bound", loss_bound, " or None")
        self.model, self.optimizer = model, optimizer
        self.inputs, self.targets = inputs, targets
        self.loss_fn = loss_fn
        self.steps, self.max_grad_norm = steps, float(max_grad_norm)
        self.loss_bound, self.loss_weight = loss_bound, float(loss_weight)
        self.subjects, self.progress, self.client = subjects, progress, client
        self.description = description.strip()
        self.history: list[TrainingStep] = []
        self._smoothed: float | None = None
        self._start_remaining: float | None = None
        self.run: TrainingRunPlan | None = None
        values = sum(p.numel() for p in model.parameters()) + (loss_bound is not None)
        if active_session() is not None:  # mock mode: nothing is charged, no allowance to read
            self.plan = step_budget(
                epsilon=target_epsilon,
                steps=steps,
                budget_delta=1e-6 if target_delta is None else target_delta,
                values=values,
            )
            return
        budget = self._client().budget()
        if target_delta is not None and target_delta != budget.delta:
            raise DPNodeError(
                f"target_delta={target_delta:g}, but the node counts every release at your "
                f"allowance's delta ({budget.delta:g}): leave target_delta out, or ask an "
                "admin for an allowance with that delta"
            )
        self.plan = step_budget(
            epsilon=target_epsilon, steps=steps, budget_delta=budget.delta, values=values
        )
        if target_epsilon > budget.remaining_epsilon:
            refusal = BudgetExceededError(
                f"this run of {steps} steps is planned to cost epsilon {target_epsilon:g}, "
                f"but {budget.remaining_epsilon:g} of your allowance remains: lower "
                "target_epsilon, or ask for more with client.request_budget(...); "
                "nothing was run or charged"
            )
            refusal.rule = budget.epsilon_rule or None
            raise refusal
        self.run = self._plan_on_node(target_epsilon, values)
        self._start_remaining = budget.remaining_epsilon

    def _plan_on_node(self, target_epsilon: float, values: int) -> TrainingRunPlan:
        """The node's policy judges the whole run now, before any step (see the module)."""
        what = f"private_training: {self.steps} steps, target epsilon {target_epsilon:g}"
        if self.description:
            what += f": {self.description}"
        try:
            planned: TrainingRunPlan = self._client().plan_run(
                steps=self.steps,
                epsilon=self.plan.epsilon,
                delta=self.plan.delta,
                values=values,
                dataset_ids=self._dataset_ids(),
                description=what,
            )
        except ApprovalRequiredError as waiting:
            ask = (
                f"{waiting.detail}\nThis training run ({what}) needs one admin approval for "
                f"all its steps: ask an admin to approve request {waiting.approval_id} "
                "(client.publish_approvals() shows its state), then call "
                "sdk.private_training(...) again with the same arguments. Nothing was run "
                "or charged."
            )
            raise _retold(waiting, ask) from waiting
        return planned

    def _dataset_ids(self) -> list[int]:
        """The datasets the run's steps read: those of its inputs, targets and subjects."""
        tensors = [self.inputs, self.targets]
        if isinstance(self.subjects, RemoteTensor):
            tensors.append(self.subjects)
        names = graph_for(tensors).input_names()
        # the datasets the node reads: inputs holding a column (or the subjects) of one
        named = (INPUT.fullmatch(n) for n in names)
        found = {int(m.group(2)) for m in named if m is not None and m.group(1) == "dataset"}
        ident = getattr(self.subjects, "id", None)  # a DatasetHandle: its @subject column
        if isinstance(ident, int):
            found.add(ident)
        return sorted(found)

    def _shows_progress(self) -> bool:
        if self.progress is not None:
            return self.progress
        if active_session() is not None:  # mock mode: no node session to ask
            return _wants_progress(None)
        return _wants_progress(getattr(self._client(), "progress", None))

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        from dpnode.sdk._publish import _client

        return _client(None, [self.inputs, self.targets])

    @property
    def epsilon(self) -> float:
        """The run's epsilon so far, as the node's ledger counts it (0 before any step)."""
        return self.history[-1].epsilon if self.history else 0.0

    def step(self) -> TrainingStep:
        """Take one step: loss on every row, a private gradient release, an optimizer step.

        Raises:
            DPNodeError: the run has taken all its steps, or the loss is not per-row.
            BudgetExceededError, GraphError: as for :func:`sdk.publish_grads`.
        """
        if len(self.history) >= self.steps:
            raise DPNodeError(f"this run has taken all of its {self.steps} steps")
        self.model.train()
        self.optimizer.zero_grad()
        losses = self.loss_fn(self.model(self.inputs), self.targets, reduction="none")
        rows = self.inputs.shape[0]
        if losses.shape[:1] != (rows,):
            raise DPNodeError(
                f"loss_fn(..., reduction='none') must give one loss per row ({rows}), "
                f"got shape {tuple(losses.shape)}"
            )
        torch.autograd.backward(losses.mean())
        extra: list[RemoteTensor] = []
        scale = 0.0
        if self.loss_bound is not None:
            # the sum of the clipped losses moves by at most loss_bound when one row is
            # replaced; scaled so that it moves by at most loss_weight * 2C
            scale = 2 * self.loss_weight * self.max_grad_norm / self.loss_bound
            per_row = losses.reshape(rows, -1).mean(1).clamp(0, self.loss_bound)
            term = per_row.sum() * scale
            assert isinstance(term, RemoteTensor)  # computed from the remote inputs
            extra.append(term)
        receipt, released = publish_grads_with(
            self.model,
            extra,
            epsilon=self.plan.epsilon,
            delta=self.plan.delta,
            max_grad_norm=self.max_grad_norm,
            subjects=self.subjects,
            client=self.client,
            run_id=None if self.run is None else self.run.run_id,
        )
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss = None
        if released:
            loss = float(released[0]) / (scale * rows)
            previous = self._smoothed
            self._smoothed = (
                loss if previous is None else _SMOOTHING * loss + (1 - _SMOOTHING) * previous
            )
        if receipt.run_epsilon is not None:  # the run's steps together, as its ledger line
            spent = receipt.run_epsilon
        elif receipt.mock or self._start_remaining is None:
            spent = self.epsilon + receipt.epsilon
        else:
            spent = self._start_remaining - receipt.remaining_epsilon
        record = TrainingStep(len(self.history) + 1, loss, spent, receipt)
        self.history.append(record)
        return record

    def __iter__(self) -> Iterator[TrainingStep]:
        """The remaining steps, one at a time, with the progress bar when asked for."""
        bar = None
        if self._shows_progress():
            from tqdm.auto import tqdm

            bar = tqdm(
                total=self.steps,
                initial=len(self.history),
                desc="private training",
                unit="step",
            )
        try:
            while len(self.history) < self.steps:
                record = self.step()
                if bar is not None:
                    shown = {"epsilon": f"{record.epsilon:.3f}"}
                    if self._smoothed is not None:
                        shown["loss"] = f"{self._smoothed:.3f}"
                    bar.set_postfix(shown, refresh=False)
                    bar.update(1)
                yield record
        finally:
            if bar is not None:
                bar.close()

    def fit(self) -> list[TrainingStep]:
        """Take every remaining step; returns the whole history."""
        for _ in self:
            pass
        return self.history


def _retold(error: PolicyRefusedError, detail: str) -> PolicyRefusedError:
    """``error`` with ``detail`` as its message, its other fields kept."""
    again = type(error)(detail, status=error.status, code=error.code)
    again.__dict__.update({k: v for k, v in vars(error).items() if k != "detail"})
    again.detail = detail
    return again


def _check_positive(name: str, value: Any, alternative: str = "") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise DPNodeError(f"{name} must be a finite number > 0{alternative}, got {value!r}")


#: ``sdk.private_training(...)`` plans a run: see :class:`PrivateTraining`.
private_training = PrivateTraining


def _steps(steps: Any, epochs: Any, batch: Any, inputs: Any) -> int:
    """The run's step count from ``steps`` or Opacus's ``epochs`` (one step each: every
    step sees every row), refusing an ``expected_batch_size`` other than the row count."""
    if steps is not None and epochs is not None and steps != epochs:
        raise DPNodeError(
            f"steps={steps!r} and epochs={epochs!r} disagree: every step uses every row, so "
            "an epoch is one step; give one of them"
        )
    count = steps if steps is not None else epochs
    name = "steps" if steps is not None or epochs is None else "epochs"
    if count is None:
        raise DPNodeError("pass steps= (each step uses every row, so an epoch is one step)")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DPNodeError(f"{name} must be a positive integer, got {count!r}")
    rows = int(inputs.shape[0]) if isinstance(inputs, RemoteTensor) and inputs.dim() else None
    if batch is not None and batch != rows:
        raise DPNodeError(
            f"expected_batch_size={batch!r}: the node trains with full batches (every step "
            f"uses all {rows} rows); it does not sample batches, which under its neighbours "
            "(replacing a row) would not lower the noise per step (docs/remote-tensors.md). "
            "Leave expected_batch_size out"
        )
    return count
