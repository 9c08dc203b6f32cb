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

With ``average="ema"`` or ``"tail"`` the model the run leaves is an average of its iterates
(:mod:`dpnode.sdk._averaging`): post-processing of the released gradients, free of charge,
loaded into the parameters after the last step. The default keeps the last iterate: on the
same runs the EMA gained neither accuracy nor a narrower spread across seeds over it, nor did
the tail mean in runs of its own (docs/performance.md).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpnode.sdk._averaging import DEFAULT_AVERAGE, IterateAverage, iterate_average
from dpnode.sdk._budget import TrainingRunPlan
from dpnode.sdk._client import _wants_progress
from dpnode.sdk._exceptions import ApprovalRequiredError, DPNodeError, PolicyRefusedError
from dpnode.sdk._publish import Receipt, publish_grads_with
from dpnode.sdk._remote import RemoteTensor, active_session
from dpnode.sdk._steps import StepBudget, step_budget, step_count
from dpnode.sdk._training_sites import Site, sites_of

__all__ = ["PrivateTraining", "TrainingStep", "private_training"]

#: weight of the last released loss in the bar's moving average
_SMOOTHING = 0.3


@dataclass(frozen=True)
class TrainingStep:
    """One step of a run: its number (from 1), the released mean loss (None if not
    tracked), the run's epsilon so far as the node's ledger counts it (several sites: the
    largest any site's ledger counts, each site's guarantee being its own), and the
    receipt (several sites: the first site's; ``receipts`` has them all)."""

    step: int
    loss: float | None
    epsilon: float
    receipt: Receipt
    #: every site's receipt, in the order of the run's sites (one site: ``(receipt,)``)
    receipts: tuple[Receipt, ...] = ()


class PrivateTraining:
    """A private training run of ``model`` on remote ``data`` to ``target_epsilon``.

    Each step is full-batch DP gradient descent: the loss on every row, each subject's
    gradient clipped to ``max_grad_norm``, their sum released with Gaussian noise, then an
    ordinary ``optimizer.step()`` on the noised gradient. Call ``.fit()`` to take every
    step with a progress bar, or iterate over the run (one :class:`TrainingStep` each).

    Args:
        model, optimizer: ordinary torch objects; the model's layers need per-example
            gradients (every layer Opacus supports has them: ``docs/remote-tensors.md``).
        data: ``(inputs, targets)``, remote tensors with one row per example; or a list
            of such pairs held by several nodes (federated training: each step every site
            releases its own clipped gradient sum, charged to its own run on its own
            ledger, and the sums are added and divided by the pooled row count).
        loss_fn: a torch loss taking ``reduction=`` (``F.cross_entropy``,
            ``F.binary_cross_entropy_with_logits``, ``F.mse_loss``, ...), called as
            ``loss_fn(model(inputs), targets, reduction="none")``; or a loss module
            (``nn.CrossEntropyLoss(weight=...)``), used with ``reduction="none"``.
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
        subjects: which rows belong to one subject (see :func:`sdk.publish_grads`); with
            several sites, a list with one per site.
        progress: show a progress bar (step, epsilon, loss); by default as the client's
            ``progress`` says (``sdk.login(progress=...)``: in a terminal or a notebook).
        client: the node session (default: the one the data came from); with several
            sites, a list with one per site.
        description: what the run is for, in your words: an admin approving the run reads
            it (at most 400 characters).
        average: what the parameters hold after the last step: ``None`` (default), the
            last iterate; ``"ema"``, an exponential moving average of the iterates over
            about the last quarter of the steps; ``"tail"``, the mean of the iterates of the
            last half. Averaging is post-processing of the released gradients: the run is
            charged the same. The optimizer's state and the model's buffers are left as
            the last step left them.

    Raises:
        BudgetExceededError: the run does not fit what is left of your allowance (or a
            dataset's cap), at any of its sites; nothing is run or charged.
        ApprovalRequiredError: the run's total is above the policy's approval threshold;
            ``approval_id`` names the request an admin answers. Nothing is run or charged:
            call ``private_training`` again with the same arguments once it is approved.
        PolicyRefusedError: a step is over the per-publish cap, or an admin denied the run
            (the message quotes the admin's reason).
        DPNodeError: invalid arguments, or too many steps for ``target_epsilon``.

    Attributes:
        plan: the per-step privacy parameters (``epsilon``, ``delta``) each publish uses
            (several sites: the first site's; each site's is in ``sites``).
        run: the run as the node planned it (its total, its ``run_id``); ``None`` in mock
            mode (several sites: the first site's).
        sites: each site's rows, session, plan and run.
        history: the steps taken so far.
        last_iterate: after the last step of an averaged run, the parameters the last step
            left, by name (``model.load_state_dict(run.last_iterate, strict=False)`` puts
            them back); ``None`` otherwise.

    Nothing is computed or charged until the run steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Sequence[Any],
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
        average: str | None = DEFAULT_AVERAGE,
    ) -> None:
        self.sites = sites_of(data, subjects, client)
        rows = sum(site.rows for site in self.sites)
        steps = step_count(steps, epochs, expected_batch_size, rows)
        self._average: IterateAverage | None = iterate_average(average, model, steps)
        self.last_iterate: dict[str, torch.Tensor] | None = None
        _check_positive("max_grad_norm", max_grad_norm)
        _check_positive("loss_weight", loss_weight)
        if loss_bound is not None:
            _check_positive("loss_bound", loss_bound, " or None")
        first = self.sites[0]
        self.model, self.optimizer = model, optimizer
        self.inputs, self.targets = first.inputs, first.targets
        self.loss_fn = per_row_loss(loss_fn)
        self.steps, self.max_grad_norm = steps, float(max_grad_norm)
        self.loss_bound, self.loss_weight = loss_bound, float(loss_weight)
        self.subjects, self.progress, self.client = subjects, progress, client
        self.description = description.strip()
        self.history: list[TrainingStep] = []
        self._smoothed: float | None = None
        values = sum(p.numel() for p in model.parameters()) + (loss_bound is not None)
        if active_session() is not None:  # mock mode: nothing is charged, no allowance to read
            for site in self.sites:
                site.plan = step_budget(
                    epsilon=target_epsilon,
                    steps=steps,
                    budget_delta=1e-6 if target_delta is None else target_delta,
                    values=values,
                )
        else:
            # every site's allowance first, then the plans: a run one site cannot pay for
            # is refused before any node has planned it
            for site in self.sites:
                site.check_budget(
                    target_epsilon=target_epsilon,
                    target_delta=target_delta,
                    steps=steps,
                    values=values,
                    named=len(self.sites) > 1,
                )
            for site in self.sites:
                site.run = self._plan_on_node(site, target_epsilon, values)
        assert first.plan is not None
        self.plan: StepBudget = first.plan
        self.run: TrainingRunPlan | None = first.run

    def _plan_on_node(self, site: Site, target_epsilon: float, values: int) -> TrainingRunPlan:
        """The node's policy judges the whole run now, before any step (see the module)."""
        what = f"private_training: {self.steps} steps, target epsilon {target_epsilon:g}"
        if len(self.sites) > 1:
            what += f", one of {len(self.sites)} sites of a federated run"
        if self.description:
            what += f": {self.description}"
        assert site.plan is not None
        try:
            planned: TrainingRunPlan = site.session().plan_run(
                steps=self.steps,
                epsilon=site.plan.epsilon,
                delta=site.plan.delta,
                values=values,
                dataset_ids=site.dataset_ids(),
                description=what,
            )
        except ApprovalRequiredError as waiting:
            where = f" at {site.name()}" if len(self.sites) > 1 else ""
            ask = (
                f"{waiting.detail}\nThis training run ({what}) needs one admin approval{where} "
                f"for all its steps: ask an admin to approve request {waiting.approval_id} "
                "(client.publish_approvals() shows its state), then call "
                "sdk.private_training(...) again with the same arguments. Nothing was run "
                "or charged."
            )
            raise _retold(waiting, ask) from waiting
        return planned

    def _shows_progress(self) -> bool:
        if self.progress is not None:
            return self.progress
        if active_session() is not None:  # mock mode: no node session to ask
            return _wants_progress(None)
        return _wants_progress(getattr(self.sites[0].session(), "progress", None))

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
        params = list(self.model.parameters())
        pooled: list[torch.Tensor | None] = [None] * len(params)
        losses: list[float] = []
        receipts: list[Receipt] = []
        spent: list[float] = []
        for site in self.sites:
            receipt, loss_sum = self._release(site)
            receipts.append(receipt)
            spent.append(self._spent(site, receipt))
            if loss_sum is not None:
                losses.append(loss_sum)
            if len(self.sites) > 1:
                # each site's noised gradient sum, kept apart from the next site's backward
                for i, p in enumerate(params):
                    if p.grad is not None:
                        part, held = p.grad * site.rows, pooled[i]
                        pooled[i] = part if held is None else held + part
                        p.grad = None
        rows = sum(site.rows for site in self.sites)
        if len(self.sites) > 1:  # the sites' sums added, over the pooled rows (public)
            for p, total in zip(params, pooled, strict=True):
                if total is not None:
                    p.grad = (total / rows).to(p.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self._average is not None:
            self._average.update()
        loss = None
        if losses:
            loss = sum(losses) / rows
            previous = self._smoothed
            self._smoothed = (
                loss if previous is None else _SMOOTHING * loss + (1 - _SMOOTHING) * previous
            )
        # each site's guarantee is its own: the run's epsilon is the largest any site counts
        record = TrainingStep(len(self.history) + 1, loss, max(spent), receipts[0], tuple(receipts))
        self.history.append(record)
        if self._average is not None and len(self.history) == self.steps:
            self.last_iterate = self._average.load()
        return record

    def _release(self, site: Site) -> tuple[Receipt, float | None]:
        """One site's part of a step: the loss on its rows, the release of its clipped
        gradient sum (``p.grad``, over its rows) and its clipped loss sum, un-scaled."""
        losses = self.loss_fn(self.model(site.inputs), site.targets)
        rows = site.rows
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
        assert site.plan is not None
        receipt, released = publish_grads_with(
            self.model,
            extra,
            epsilon=site.plan.epsilon,
            delta=site.plan.delta,
            max_grad_norm=self.max_grad_norm,
            subjects=site.subjects,
            client=site.client,
            run_id=None if site.run is None else site.run.run_id,
        )
        return receipt, (float(released[0]) / scale if released else None)

    def _spent(self, site: Site, receipt: Receipt) -> float:
        """The site's run epsilon so far, as its node's ledger counts it."""
        if receipt.run_epsilon is not None:  # the run's steps together, as its ledger line
            site.spent = receipt.run_epsilon
        elif receipt.mock or site.start_remaining is None:
            site.spent += receipt.epsilon
        else:
            site.spent = site.start_remaining - receipt.remaining_epsilon
        return site.spent

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


def per_row_loss(loss_fn: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss_fn`` as a function of (outputs, targets) giving one loss per row.

    A functional loss is called with ``reduction="none"`` (``F.cross_entropy``); a loss
    module (``nn.CrossEntropyLoss(weight=...)``, as Opacus's examples pass a criterion) is
    used through a copy whose ``reduction`` is ``"none"``, its own left as it was. A
    callable that takes no ``reduction`` is refused here, before the run is planned, rather
    than failing inside the first step.

    Raises:
        DPNodeError: ``loss_fn`` is not callable, or cannot give per-row losses.
    """
    if isinstance(loss_fn, torch.nn.Module) and isinstance(
        getattr(loss_fn, "reduction", None), str
    ):
        per_row = copy.copy(loss_fn)  # a shallow copy: the weights are shared, not copied
        setattr(per_row, "reduction", "none")  # noqa: B010 (Module's typed __setattr__)
        return lambda out, targets: per_row(out, targets)
    if not callable(loss_fn):
        raise DPNodeError(f"loss_fn must be a torch loss, got {type(loss_fn).__name__}")
    try:
        parameters = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let it answer for itself
        parameters = None
    if parameters is not None and not any(
        p.name == "reduction" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    ):
        raise DPNodeError(
            f"loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)!r} takes no "
            "reduction=: each row's gradient is clipped, so the loss must come per row. "
            "Pass a torch loss (F.cross_entropy, or a module such as nn.CrossEntropyLoss()), "
            "or write one as def loss(out, y, reduction='none'): ... returning one loss a row "
            "when reduction is 'none'"
        )
    return lambda out, targets: loss_fn(out, targets, reduction="none")


def _check_positive(name: str, value: Any, alternative: str = "") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise DPNodeError(f"{name} must be a finite number > 0{alternative}, got {value!r}")


#: ``sdk.private_training(...)`` plans a run: see :class:`PrivateTraining`.
private_training = PrivateTraining
