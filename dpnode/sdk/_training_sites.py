"""The sites of a private training run: the rows on one node, its session, plan and run.

A run trains on one ``(inputs, targets)`` pair, or on several held by different nodes
(federated training). Each site is planned against its own node's budget and policy, and
each step every site releases its own noised clipped gradient sum, charged to its own run;
the client adds the sums and divides by the pooled row count (public), which is
post-processing of the sites' releases. This module holds what is per site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpnode.core.inputs import INPUT
from dpnode.sdk._budget import TrainingRunPlan
from dpnode.sdk._exceptions import BudgetExceededError, DPNodeError
from dpnode.sdk._remote import RemoteTensor, graph_for
from dpnode.sdk._steps import StepBudget, step_budget

__all__ = ["Site", "sites_of"]


@dataclass
class Site:
    """One node's rows of a run, and what its node planned for them."""

    inputs: RemoteTensor
    targets: RemoteTensor
    subjects: Any
    client: Any
    plan: StepBudget | None = None
    run: TrainingRunPlan | None = None
    #: the allowance left before the first step (to count the run's epsilon without a run)
    start_remaining: float | None = None
    #: the site's run epsilon so far, as its ledger counts it
    spent: float = 0.0

    @property
    def rows(self) -> int:
        return int(self.inputs.shape[0])

    def session(self) -> Any:
        """The node session its steps go to: ``client``, else the one its data came from."""
        if self.client is not None:
            return self.client
        from dpnode.sdk._publish import _client

        return _client(None, [self.inputs, self.targets])

    def name(self) -> str:
        return str(getattr(self.session(), "url", "this node"))

    def dataset_ids(self) -> list[int]:
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

    def check_budget(
        self,
        *,
        target_epsilon: float,
        target_delta: float | None,
        steps: int,
        values: int,
        named: bool = False,
    ) -> None:
        """Plan the per-step noise from this node's allowance, refusing a run that does not
        fit it (nothing is run or charged anywhere). ``named``: say which node refused."""
        budget = self.session().budget()
        where = f" at {self.name()}" if named else ""
        if target_delta is not None and target_delta != budget.delta:
            raise DPNodeError(
                f"target_delta={target_delta:g}, but the node{where} counts every release "
                f"at your allowance's delta ({budget.delta:g}): leave target_delta out, or "
                "ask an admin for an allowance with that delta"
            )
        self.plan = step_budget(
            epsilon=target_epsilon, steps=steps, budget_delta=budget.delta, values=values
        )
        if target_epsilon > budget.remaining_epsilon:
            refusal = BudgetExceededError(
                f"this run of {steps} steps is planned to cost epsilon {target_epsilon:g}"
                f"{where}, but {budget.remaining_epsilon:g} of your allowance{where and ' there'} "
                "remains: "
                "lower target_epsilon, or ask for more with client.request_budget(...); "
                "nothing was run or charged"
            )
            refusal.rule = budget.epsilon_rule or None
            raise refusal
        self.start_remaining = budget.remaining_epsilon


def sites_of(data: Sequence[Any], subjects: Any, client: Any) -> list[Site]:
    """The sites of ``data``: ``(inputs, targets)``, or a list of such pairs, one a site.

    Raises:
        DPNodeError: not remote tensors with one row per example, per-row shapes or dtypes
            that differ between sites, or ``subjects``/``client`` not one per site.
    """
    one = len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data)
    pairs = [tuple(data)] if one else [tuple(p) for p in data]
    many = len(pairs) > 1
    for what, value in (("subjects", subjects), ("client", client)):
        if (
            many
            and value is not None
            and (not isinstance(value, Sequence) or len(value) != len(pairs))
        ):
            raise DPNodeError(
                f"{what} for a run on {len(pairs)} sites is a list with one per site (or None)"
            )
    found: list[Site] = []
    for k, pair in enumerate(pairs):
        inputs, targets = pair if len(pair) == 2 else (None, None)
        if not (isinstance(inputs, RemoteTensor) and isinstance(targets, RemoteTensor)):
            raise DPNodeError(
                "data must be (inputs, targets), two remote tensors with the same rows "
                "(e.g. ds.tensors('features', 'label')), or a list of such pairs, one per site"
            )
        if inputs.shape[0] != targets.shape[0]:
            raise DPNodeError(
                f"inputs have {inputs.shape[0]} rows but targets {targets.shape[0]}: "
                "each row is one example"
            )
        first = found[0] if found else None
        if first is not None and (
            first.inputs.shape[1:] != inputs.shape[1:]
            or first.inputs.dtype != inputs.dtype
            or first.targets.shape[1:] != targets.shape[1:]
            or first.targets.dtype != targets.dtype
        ):
            raise DPNodeError(
                f"site {k}'s rows differ from site 0's: inputs {inputs.dtype} "
                f"{tuple(inputs.shape[1:])} and targets {targets.dtype} "
                f"{tuple(targets.shape[1:])} per row, where site 0 has "
                f"{first.inputs.dtype} {tuple(first.inputs.shape[1:])} and "
                f"{first.targets.dtype} {tuple(first.targets.shape[1:])}: one model trains on "
                "the same columns everywhere (sdk.federated(handles) checks their schema)"
            )
        found.append(
            Site(
                inputs,
                targets,
                subjects[k] if many and subjects is not None else subjects,
                client[k] if many and client is not None else client,
            )
        )
    return found
