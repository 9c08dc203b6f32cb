"""Your privacy budget, the ledger of what was spent, and the admin records around them:
budget requests and grants, publishes waiting for approval, policy revisions."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from html import escape
from typing import Any

from dpnode.sdk._caps import DatasetRead
from dpnode.sdk._display import dataclass_rows, fields_table
from dpnode.sdk._ledger import LedgerEntry


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True)
class BudgetStatus:
    """Your allowance under the policy in force and what the privacy filter counts as spent.

    ``spent_epsilon`` adds pure (Laplace) charges and converted zCDP (Gaussian) ones;
    ``spent_delta`` adds the deltas the samplers' deviations cost and, once any Gaussian release
    was made, the share of ``delta`` the zCDP total is converted at. ``remaining_epsilon`` and
    ``remaining_delta`` are what is left of ``epsilon`` and ``delta`` after exactly those, so
    spent and remaining add up to the allowance. ``pure_epsilon`` and ``rho`` are the raw sums
    of the ledger and ``sampler_tv`` the samplers' deltas, in the current renewal window
    (``period_start`` .. ``renews_at``; both ``None`` when budgets never renew).
    ``epsilon_rule`` says where the allocation comes from (``roles.data_scientist.epsilon``,
    ``users.EMAIL.epsilon``, ``defaults.epsilon``); ``granted_epsilon`` is the part of it
    granted on request.
    """

    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    pure_epsilon: float
    rho: float
    sampler_tv: float
    remaining_delta: float = 0.0
    epsilon_rule: str = ""
    delta_rule: str = ""
    granted_epsilon: float = 0.0
    granted_delta: float = 0.0
    period_start: datetime | None = None
    renews_at: datetime | None = None
    policy: str = ""
    policy_revision: int | None = None
    #: the charges of the window, oldest first (set by ``client.budget()``, for :meth:`plot`)
    _ledger: Callable[[], Sequence[LedgerEntry]] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetStatus:
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in body:
                continue
            value = body[f.name]
            if f.name in ("period_start", "renews_at"):
                value = _at(value)
            elif f.name in ("epsilon_rule", "delta_rule", "policy", "policy_revision"):
                pass
            else:
                value = float(value)
            values[f.name] = value
        return cls(**values)

    def __str__(self) -> str:
        text = (
            f"epsilon: {self.spent_epsilon:g} of {self.epsilon:g} spent, "
            f"{self.remaining_epsilon:g} remaining; delta: {self.spent_delta:.3g} of "
            f"{self.delta:.3g} used, {self.remaining_delta:.3g} remaining"
        )
        if self.renews_at is not None:
            text += f"; renews at {self.renews_at.isoformat()}"
        return text

    def _repr_html_(self) -> str:
        rows = [
            (
                "epsilon",
                f"{self.spent_epsilon:g} of {self.epsilon:g} spent, "
                f"{self.remaining_epsilon:g} remaining",
            ),
            (
                "delta",
                f"{self.spent_delta:.3g} of {self.delta:.3g} used, "
                f"{self.remaining_delta:.3g} remaining",
            ),
            *dataclass_rows(self),
        ]
        return fields_table("privacy budget", rows)

    def plot(self, ax: Any = None, *, ledger: Sequence[LedgerEntry] | None = None) -> Any:
        """Plot epsilon spent over time against the allocation, and return the axes.

        The curve steps at each charge of the current renewal window (``ledger``: those
        charges oldest first; default: read from the node). Laplace charges add their
        epsilon; Gaussian ones add to a zCDP total, drawn as the privacy filter converts it at
        the delta it reserves for that (``spent_delta - sampler_tv``); the last point is the
        node's own count, ``spent_epsilon``. Needs matplotlib: ``pip install 'dpnode[plot]'``.

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(
                "BudgetStatus.plot() needs matplotlib, an optional dependency: "
                "pip install 'dpnode[plot]'"
            ) from None
        from dpnode.policies import filter_epsilon

        if ledger is None:
            ledger = [] if self._ledger is None else self._ledger()
        reserved = self.spent_delta - self.sampler_tv
        times: list[datetime] = []
        spent: list[float] = []
        pure = rho = 0.0
        for entry in ledger:
            pure += entry.epsilon
            rho += entry.rho
            converted = filter_epsilon(rho, reserved) if rho and 0 < reserved < 1 else 0.0
            times.append(entry.at)
            spent.append(pure + converted)
        now = datetime.now(tz=times[-1].tzinfo if times else None)
        start = self.period_start or (times[0] if times else now)
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        ax.step(
            [start, *times, now],
            [0.0, *spent, self.spent_epsilon],
            where="post",
            label="epsilon spent",
        )
        ax.axhline(
            self.epsilon, color="tab:red", linestyle="--", label=f"allocation ({self.epsilon:g})"
        )
        ax.set_ylabel("epsilon")
        ax.set_ylim(0, max(self.epsilon, self.spent_epsilon) * 1.1 or 1.0)
        ax.set_title(
            f"privacy budget under policy {self.policy!r}" if self.policy else "privacy budget"
        )
        ax.legend(loc="upper left")
        ax.figure.autofmt_xdate()
        return ax


@dataclass(frozen=True)
class BudgetRequest:
    """A request for more budget and, once answered, the decision.

    ``status`` is ``"pending"``, ``"approved"`` (``granted_epsilon``/``granted_delta`` say how
    much) or ``"denied"`` (``decision_reason`` says why).
    """

    id: int
    user_id: int
    user_email: str
    created_at: datetime
    epsilon: float
    delta: float
    reason: str
    status: str
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    granted_epsilon: float | None
    granted_delta: float | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetRequest:
        return cls(
            **{
                **body,
                "created_at": datetime.fromisoformat(body["created_at"]),
                "decided_at": _at(body["decided_at"]),
            }
        )


@dataclass(frozen=True)
class BudgetGrant:
    """Budget added to a user's allocation, from ``at`` on (by an admin, maybe on request)."""

    id: int
    at: datetime
    user_id: int
    epsilon: float
    delta: float
    granted_by: str
    reason: str
    request_id: int | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetGrant:
        return cls(**{**body, "at": datetime.fromisoformat(body["at"])})


@dataclass(frozen=True)
class PublishApproval:
    """A publish that waited for an admin: ``pending``, ``approved``, ``denied``, or ``used``
    (an approved publish ran, ``ledger_id`` is its charge; a denial was reported).

    ``kind`` ``"run"``: a whole training run (``description``), ``epsilon`` and ``delta``
    its total; once approved its ``steps`` publishes of ``step_epsilon`` / ``step_delta``
    each run under it (``steps_used`` so far), and the last one uses it up.
    """

    id: int
    user_id: int
    user_email: str
    created_at: datetime
    mechanism: str
    epsilon: float
    delta: float
    dataset_ids: tuple[int, ...]
    graph_hash: str | None
    rule: str
    reason: str
    policy_revision: int | None
    status: str
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    ledger_id: int | None
    kind: str = "publish"
    description: str = ""
    steps: int | None = None
    steps_used: int = 0
    step_epsilon: float | None = None
    step_delta: float | None = None
    #: what the publish computes, as pseudo-torch lines (the last: what it releases)
    computation: tuple[str, ...] = ()
    sensitivity: float | None = None
    noise_scale: float | None = None
    outputs: tuple[tuple[int, ...], ...] = ()
    #: the requester's budget left, read when this was fetched
    remaining_epsilon: float | None = None
    remaining_delta: float | None = None
    #: the datasets it reads, with their caps where you may see them (admins, owners)
    datasets: tuple[DatasetRead, ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PublishApproval:
        return cls(
            **{
                **body,
                "created_at": datetime.fromisoformat(body["created_at"]),
                "decided_at": _at(body["decided_at"]),
                "dataset_ids": tuple(body["dataset_ids"]),
                "computation": tuple(body.get("computation", ())),
                "outputs": tuple(tuple(o) for o in body.get("outputs", ())),
                "datasets": tuple(DatasetRead.from_json(d) for d in body.get("datasets", ())),
            }
        )

    def __str__(self) -> str:
        """What an admin reads before answering: who asks, for what, the computation, its
        noise, the requester's budget and the datasets' caps."""
        what = f"{self.kind} #{self.id} by {self.user_email} ({self.status})"
        lines = [
            f"{what}: epsilon {self.epsilon:g}, delta {self.delta:g}, {self.mechanism}",
            f"  description: {self.description or '(none given)'}",
        ]
        lines += [f"  {line}" for line in self.computation]
        if self.sensitivity is not None and self.noise_scale is not None:
            lines.append(
                f"  sensitivity {self.sensitivity:.4g}, noise scale {self.noise_scale:.4g}"
            )
        if self.remaining_epsilon is not None:
            lines.append(
                f"  {self.user_email} has epsilon {self.remaining_epsilon:g}, "
                f"delta {self.remaining_delta or 0:g} left"
            )
        lines += [f"  reads {d}" for d in self.datasets]
        return "\n".join(lines)


@dataclass(frozen=True)
class TrainingRunPlan:
    """A training run the node's policy lets start (``client.plan_run``).

    ``run_id`` is the run each step's publish names (``publish_grads(..., run_id=)``): the
    ledger shows its steps as one line (``client.ledger()``). ``approval_id`` is the admin's
    approval it runs under (``None``: it needed none) and ``steps_used`` the steps already
    published under it; ``epsilon`` and ``delta`` are the run's total as the ledger will
    count it; ``remaining_epsilon`` what your budget keeps once every step has run.
    """

    run_id: int
    steps: int
    steps_used: int
    epsilon: float
    delta: float
    step_epsilon: float
    step_delta: float
    remaining_epsilon: float
    policy: str
    policy_revision: int | None
    approval_id: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TrainingRunPlan:
        return cls(**body)


@dataclass(frozen=True)
class PolicyRevision:
    """A revision of the node's budget policy (``revision`` None: the built-in default).

    ``document`` is the canonical form; ``source`` the text as it was sent. ``changed`` is
    false when applying it stored nothing (it equals the policy in force); ``warnings`` note
    what did not stop it, e.g. a cap on a dataset not uploaded yet.
    """

    revision: int | None
    at: datetime | None
    created_by: str
    reason: str
    name: str
    content_hash: str
    document: dict[str, Any]
    source: str
    changed: bool = True
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PolicyRevision:
        return cls(
            **{
                **body,
                "at": _at(body["at"]),
                "warnings": tuple(body.get("warnings", ())),
            }
        )

    def _repr_html_(self) -> str:
        document = escape(json.dumps(self.document, indent=2, sort_keys=True, default=str))
        title = f"policy {self.name!r}, " + (
            f"revision {self.revision}" if self.revision is not None else "built-in default"
        )
        return fields_table(
            title,
            dataclass_rows(self, skip=("document", "source")),
            after=f"<pre>{document}</pre>",
        )
