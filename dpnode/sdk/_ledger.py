"""The ledger of what your publishes cost: one line per training run or publish.

``client.ledger()`` answers with :class:`LedgerLine` records, newest first: a publish of its
own is a line, and every step of a training run (``sdk.private_training``, or
``sdk.publish_grads(..., run_id=...)`` after ``client.plan_run``) is *one* line with its
step count and their cost together; :attr:`LedgerLine.entries` (or :meth:`Ledger.expand`)
gives the steps one by one.

Each row says what it cost in the budget's own terms: ``epsilon_used`` is how much it added
to the epsilon your budget counts as spent (Gaussian releases compose as zCDP, converted to
epsilon at your allowance's delta, so the first step of a run costs more than the later
ones). The rows of a renewal period add up to ``client.budget().spent_epsilon``; the raw
``epsilon`` (pure) and ``rho`` (zCDP) charged are kept beside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from dpnode.sdk._display import Records, dataclass_rows, fields_table, records_table

T = TypeVar("T")


def _used(value: float | None) -> float:
    """An ``epsilon_used`` from the node: ``null`` means no delta to convert rho at."""
    return float("inf") if value is None else float(value)


@dataclass(frozen=True)
class LedgerEntry:
    """One charge to a budget, and the policy revision that allowed it.

    ``epsilon_used`` / ``delta_used``: what it added to the user's epsilon and delta used,
    as ``client.budget()`` counts them; ``epsilon``, ``rho`` and ``sampler_tv`` what it
    charged in its mechanism's terms. ``run_id``: the training run it is a step of.
    ``cap_only``: paid from the caps of the datasets it read, not from the user's budget (a
    data owner's synthetic mock; nothing used of the budget).
    """

    id: int
    at: datetime
    mechanism: str
    epsilon: float
    rho: float
    sampler_tv: float
    dataset_ids: tuple[int, ...]
    graph_hash: str | None
    detail: dict[str, Any]
    user_id: int | None = None
    user_email: str | None = None
    policy_revision: int | None = None
    run_id: int | None = None
    epsilon_used: float = 0.0
    delta_used: float = 0.0
    cap_only: bool = False

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LedgerEntry:
        return cls(
            id=body["id"],
            at=datetime.fromisoformat(body["at"]),
            mechanism=body["mechanism"],
            epsilon=body["epsilon"],
            rho=body["rho"],
            sampler_tv=body["sampler_tv"],
            dataset_ids=tuple(body["dataset_ids"]),
            graph_hash=body["graph_hash"],
            detail=body["detail"],
            user_id=body.get("user_id"),
            user_email=body.get("user_email"),
            policy_revision=body.get("policy_revision"),
            run_id=body.get("run_id"),
            epsilon_used=_used(body.get("epsilon_used", 0.0)),
            delta_used=float(body.get("delta_used", 0.0)),
            cap_only=bool(body.get("cap_only", False)),
        )

    def __str__(self) -> str:
        step = f", step of run {self.run_id}" if self.run_id is not None else ""
        step += ", paid from the datasets' caps" if self.cap_only else ""
        return (
            f"publish {self.id} ({self.mechanism}{step}), epsilon used "
            f"{self.epsilon_used:.6g}, delta used {self.delta_used:.3g}"
        )

    def _repr_html_(self) -> str:
        return fields_table(f"ledger entry {self.id}", dataclass_rows(self))


@dataclass(frozen=True)
class LedgerRun:
    """A training run as it was planned: its ``steps``, each step's epsilon and delta, and
    the admin's approval it ran under (``None``: it needed none)."""

    id: int
    created_at: datetime
    description: str
    steps: int
    step_epsilon: float
    step_delta: float
    approval_id: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LedgerRun:
        return cls(**{**body, "created_at": datetime.fromisoformat(body["created_at"])})


@dataclass(frozen=True)
class LedgerLine:
    """One line of the ledger: a publish of its own (``kind`` ``"charge"``) or every step of
    a training run (``"run"``; ``run`` says how it was planned).

    ``steps`` counts its charges and ``entries`` lists them, newest first; ``epsilon_used``
    and ``delta_used`` are what they added to your budget together (for a run: its total in
    epsilon terms, the sum of its steps'). ``id`` and ``at`` are its newest charge's (page
    with ``client.ledger(before_id=line.id)``); ``epsilon``, ``rho`` and ``sampler_tv`` the
    raw amounts charged, summed. A line of one publish also has its ``graph_hash`` and
    ``detail``.
    """

    id: int
    at: datetime
    kind: str
    steps: int
    epsilon_used: float
    delta_used: float
    mechanism: str
    epsilon: float
    rho: float
    sampler_tv: float
    dataset_ids: tuple[int, ...]
    run_id: int | None = None
    description: str = ""
    user_id: int | None = None
    user_email: str | None = None
    policy_revision: int | None = None
    first_at: datetime | None = None
    graph_hash: str | None = None
    detail: dict[str, Any] | None = None
    run: LedgerRun | None = None
    entries: tuple[LedgerEntry, ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LedgerLine:
        entries = tuple(LedgerEntry.from_json(e) for e in body["entries"])
        run = None if body.get("run") is None else LedgerRun.from_json(body["run"])
        single = entries[0] if run is None and len(entries) == 1 else None
        return cls(
            id=body["id"],
            at=datetime.fromisoformat(body["at"]),
            kind=body["kind"],
            steps=body["steps"],
            epsilon_used=_used(body["epsilon_used"]),
            delta_used=float(body["delta_used"]),
            mechanism=body["mechanism"],
            epsilon=body["epsilon"],
            rho=body["rho"],
            sampler_tv=body["sampler_tv"],
            dataset_ids=tuple(body["dataset_ids"]),
            run_id=None if run is None else run.id,
            description="" if run is None else run.description,
            user_id=body.get("user_id"),
            user_email=body.get("user_email"),
            policy_revision=body.get("policy_revision"),
            first_at=datetime.fromisoformat(body["first_at"]),
            graph_hash=None if single is None else single.graph_hash,
            detail=None if single is None else single.detail,
            run=run,
            entries=entries,
        )

    def __str__(self) -> str:
        what = (
            f"run {self.run_id}: {self.steps} step{'s' if self.steps != 1 else ''}"
            if self.kind == "run"
            else f"publish {self.id} ({self.mechanism})"
        )
        return f"{what}, epsilon used {self.epsilon_used:.6g}, delta used {self.delta_used:.3g}"

    def _repr_html_(self) -> str:
        rows = dataclass_rows(self, skip=("entries", "run", "detail"))
        steps = Ledger(self.entries)
        return fields_table(f"ledger line {self.id}", rows, after=steps._repr_html_())


class Ledger(Records[T]):
    """Charges to budgets, newest first (``client.ledger()``): one :class:`LedgerLine` per
    training run or publish. :meth:`expand` lists every charge on its own, :meth:`runs` the
    training runs only. It is a list, shown as a table in a notebook (a run's steps under a
    disclosure), with ``to_pandas()`` (one row a line; ``expand().to_pandas()``: one a
    charge)."""

    title = "ledger"

    def __str__(self) -> str:
        """One text line per run or publish, newest first, with its time (UTC)::

        2026-11-29 04:49:22  run 1: 5 steps, epsilon used 0.9999, delta used 9.99e-07
        2026-11-29 04:49:21  publish 1 (laplace), epsilon used 0.2, delta used 1e-18
        """
        if not self:
            return f"(no {self.title} lines)"
        return "\n".join(f"{getattr(x, 'at', ''):%Y-%m-%d %H:%M:%S}  {x}" for x in self)

    def expand(self) -> Ledger[LedgerEntry]:
        """Every charge of these lines on its own (a run's steps one by one), newest first."""
        entries: list[LedgerEntry] = []
        for item in self:
            if isinstance(item, LedgerLine):
                entries += item.entries
            elif isinstance(item, LedgerEntry):
                entries.append(item)
        return Ledger(entries)

    def runs(self) -> Ledger[LedgerLine]:
        """The lines that are training runs."""
        return Ledger(x for x in self if isinstance(x, LedgerLine) and x.kind == "run")

    def _columns(self) -> list[str]:
        hidden = {"entries", "run", "detail", "graph_hash", "first_at"}
        return [c for c in super()._columns() if c not in hidden]

    def _repr_html_(self) -> str:
        if not any(isinstance(x, LedgerLine) and x.kind == "run" for x in self):
            return super()._repr_html_()
        columns = self._columns()
        rows = [[getattr(r, c) for c in columns] for r in self]
        steps = [_steps_html(r) for r in self]
        return records_table(self.title, columns, rows, after_rows=steps)


def _steps_html(item: Any) -> str:
    """A run's steps, as a disclosure under its line ('' for a publish of its own)."""
    if not isinstance(item, LedgerLine) or item.kind != "run":
        return ""
    table = Ledger(item.entries)
    table.title = f"the {item.steps} steps of run {item.run_id}"
    return f"<details><summary>steps</summary>{table._repr_html_()}</details>"


def lines_of(rows: Iterable[dict[str, Any]]) -> Ledger[LedgerLine]:
    """The node's ``GET /ledger/grouped`` answer, as a :class:`Ledger`."""
    return Ledger(LedgerLine.from_json(r) for r in rows)
