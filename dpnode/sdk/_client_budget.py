"""The client's privacy budget calls: your budget and ledger, budget requests and grants,
training runs planned and publishes waiting for an admin, and the budget policy (admins)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpnode.sdk._budget import (
    BudgetGrant,
    BudgetRequest,
    BudgetStatus,
    PolicyRevision,
    PublishApproval,
    TrainingRunPlan,
)
from dpnode.sdk._display import Grants
from dpnode.sdk._ledger import Ledger, LedgerEntry, LedgerLine, lines_of

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle


class BudgetCalls:
    """:class:`~sdk.Client`'s budget calls (a mixin: it sends through the client's requests)."""

    if TYPE_CHECKING:

        def _json(self, method: str, path: str, **kwargs: Any) -> Any: ...

        def _user_id(self, email: str) -> int: ...

        def dataset(self, ref: int | str) -> DatasetHandle: ...

    def budget(self, *, user_id: int | None = None) -> BudgetStatus:
        """Your budget: total, spent and remaining (admins: anyone's, by ``user_id``)."""
        params = {"user_id": user_id} if user_id is not None else {}
        status = BudgetStatus.from_json(self._json("GET", "/budget", params=params))
        return dataclasses.replace(status, _ledger=lambda: self._window_ledger(status, user_id))

    def _window_ledger(self, status: BudgetStatus, user_id: int | None) -> list[LedgerEntry]:
        """The charges of ``status``'s renewal window (all of them when budgets never renew),
        oldest first, paging back through the ledger."""
        entries: list[LedgerEntry] = []
        before: int | None = None
        while True:
            page = self.ledger_entries(user_id=user_id, before_id=before, limit=1000)
            entries += page
            inside = status.period_start is None or (page and page[-1].at >= status.period_start)
            if len(page) < 1000 or not inside:
                break
            before = page[-1].id
        start = status.period_start
        return [e for e in reversed(entries) if start is None or e.at >= start]

    def _ledger_params(
        self,
        user_id: int | None,
        user: int | str | None,
        dataset: int | str | None,
        everyone: bool,
        before_id: int | None,
        limit: int,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if user is not None:
            user_id = user if isinstance(user, int) else self._user_id(user)
        if user_id is not None:
            params["user_id"] = user_id
        if everyone:
            params["all_users"] = True
        if dataset is not None:
            params["dataset_id"] = dataset if isinstance(dataset, int) else self.dataset(dataset).id
        if before_id is not None:
            params["before_id"] = before_id
        return params

    def ledger(
        self,
        *,
        user_id: int | None = None,
        user: int | str | None = None,
        dataset: int | str | None = None,
        everyone: bool = False,
        before_id: int | None = None,
        limit: int = 100,
    ) -> Ledger[LedgerLine]:
        """What your publishes cost, newest first, one line per training run or publish:
        yours, or (admins) one user's (``user``: id or email) or ``everyone``'s; ``dataset``
        (id or name) keeps the charges that read it.

        A training run's steps are one line (``kind`` ``"run"``) with their count
        (``steps``) and their cost together in epsilon terms (``epsilon_used``), its steps in
        ``line.entries``; ``.expand()`` lists every charge on its own. Each line's
        ``epsilon_used`` is what it added to your budget's ``spent_epsilon``, so the lines of
        a renewal period add up to it. ``limit`` counts lines; ``before_id=line.id`` pages.
        A list, shown as a table in a notebook; ``.to_pandas()`` makes a DataFrame."""
        params = self._ledger_params(user_id, user, dataset, everyone, before_id, limit)
        return lines_of(self._json("GET", "/ledger/grouped", params=params))

    def ledger_entries(
        self,
        *,
        user_id: int | None = None,
        user: int | str | None = None,
        dataset: int | str | None = None,
        run_id: int | None = None,
        everyone: bool = False,
        before_id: int | None = None,
        limit: int = 100,
    ) -> Ledger[LedgerEntry]:
        """Every charge on a row of its own, newest first (the filters of :meth:`ledger`;
        ``run_id``: the steps of one training run). Each names the policy revision that
        allowed it and, for a run's step, the run."""
        params = self._ledger_params(user_id, user, dataset, everyone, before_id, limit)
        if run_id is not None:
            params["run_id"] = run_id
        return Ledger(LedgerEntry.from_json(e) for e in self._json("GET", "/ledger", params=params))

    def request_budget(self, *, epsilon: float, delta: float = 0.0, reason: str) -> BudgetRequest:
        """Ask the node's admins for more budget, saying why; see ``budget_requests()`` for
        the answer. An approval adds to your allocation from then on.

        Raises:
            InvalidRequestError: a negative or non-finite amount, or no reason.
        """
        body = {"epsilon": epsilon, "delta": delta, "reason": reason}
        return BudgetRequest.from_json(self._json("POST", "/budget/requests", json=body))

    def budget_requests(
        self, *, status: str | None = None, user: int | str | None = None, limit: int = 100
    ) -> list[BudgetRequest]:
        """Budget requests, newest first: yours, or (admins) everyone's or one ``user``'s;
        ``status`` is ``"pending"``, ``"approved"`` or ``"denied"``."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if user is not None:
            params["user_id"] = user if isinstance(user, int) else self._user_id(user)
        rows = self._json("GET", "/budget/requests", params=params)
        return [BudgetRequest.from_json(r) for r in rows]

    def approve_budget_request(
        self,
        request_id: int,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        reason: str,
    ) -> BudgetRequest:
        """Approve a pending request (admins), granting what was asked or ``epsilon``/``delta``.

        Raises:
            ConflictError: it was already answered.
        """
        body: dict[str, Any] = {"reason": reason}  # required: the audit log says why
        if epsilon is not None:
            body["epsilon"] = epsilon
        if delta is not None:
            body["delta"] = delta
        answer = self._json("POST", f"/budget/requests/{request_id}/approve", json=body)
        return BudgetRequest.from_json(answer)

    def deny_budget_request(self, request_id: int, *, reason: str) -> BudgetRequest:
        """Deny a pending request, saying why (admins)."""
        body = {"reason": reason}
        answer = self._json("POST", f"/budget/requests/{request_id}/deny", json=body)
        return BudgetRequest.from_json(answer)

    def grant_budget(
        self, user: int | str, *, epsilon: float, delta: float = 0.0, reason: str
    ) -> BudgetGrant:
        """Add budget to a user's allocation without a request (admins). ``user``: id or email."""
        body = {"user": user, "epsilon": epsilon, "delta": delta, "reason": reason}
        return BudgetGrant.from_json(self._json("POST", "/budget/grants", json=body))

    def grants(self, *, user: int | str | None = None, limit: int = 100) -> Grants[BudgetGrant]:
        """Budget grants, newest first: yours (admins: everyone's, or one ``user``'s); a list
        with ``.to_pandas()``."""
        params: dict[str, Any] = {"limit": limit}
        if user is not None:
            params["user_id"] = user if isinstance(user, int) else self._user_id(user)
        return Grants(
            BudgetGrant.from_json(g) for g in self._json("GET", "/budget/grants", params=params)
        )

    def plan_run(
        self,
        *,
        steps: int,
        epsilon: float,
        delta: float,
        values: int,
        dataset_ids: Sequence[int] = (),
        description: str = "",
    ) -> TrainingRunPlan:
        """Plan a training run on the node before its first step; the policy judges it whole.

        ``steps`` Gaussian publishes at ``(epsilon, delta)`` each, each noising at most
        ``values`` values and reading only ``dataset_ids``. ``sdk.private_training`` calls
        this for you. Nothing is charged: each step is, when it is published with the
        returned ``run_id`` (``sdk.publish_grads(..., run_id=plan.run_id)``), and the ledger
        shows the run's steps as one line. Planning the same run again before its first
        step returns the same run.

        Raises:
            BudgetExceededError: the run's total does not fit your budget or a dataset's cap.
            PolicyRefusedError: a step is over a per-publish cap, or an admin denied the run
                (``rule`` ``"approval"``; the message quotes the admin's reason).
            ApprovalRequiredError: the run's total is above the policy's approval threshold:
                request ``approval_id`` waits for an admin; plan the same run again once it
                is approved.
        """
        body = {
            "steps": steps,
            "epsilon": epsilon,
            "delta": delta,
            "values": values,
            "dataset_ids": list(dataset_ids),
            "description": description,
        }
        return TrainingRunPlan.from_json(self._json("POST", "/publish/runs", json=body))

    def publish_approvals(
        self, *, status: str | None = None, limit: int = 100
    ) -> list[PublishApproval]:
        """Publishes and training runs that waited for an admin, newest first (yours;
        admins: everyone's)."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        rows = self._json("GET", "/publish/approvals", params=params)
        return [PublishApproval.from_json(a) for a in rows]

    def approve_publish(self, approval_id: int, *, reason: str) -> PublishApproval:
        """Approve a waiting publish (admins): the user's next identical publish runs, once."""
        answer = self._json(
            "POST", f"/publish/approvals/{approval_id}/approve", json={"reason": reason}
        )
        return PublishApproval.from_json(answer)

    def deny_publish(self, approval_id: int, *, reason: str) -> PublishApproval:
        """Deny a waiting publish, saying why (admins)."""
        answer = self._json(
            "POST", f"/publish/approvals/{approval_id}/deny", json={"reason": reason}
        )
        return PublishApproval.from_json(answer)

    # -- budget policy (admins) -------------------------------------------------------------

    def policy(self) -> PolicyRevision:
        """The budget policy in force (admins)."""
        return PolicyRevision.from_json(self._json("GET", "/policy"))

    def set_policy(self, policy: str | Path | Mapping[str, Any], *, reason: str) -> PolicyRevision:
        """Apply a budget policy (admins): in force from the next publish, no restart.

        Args:
            policy: TOML text, a path to a TOML file (a ``Path``, or a one-line string
                ending in ``.toml``), or the same shape as a mapping (see
                ``dpnode/policies/default.toml`` for every key).
            reason: why, for the audit log.

        Raises:
            InvalidPolicyError: the document is malformed; the message names every bad key.
        """
        body: dict[str, Any] = {"reason": reason}
        if isinstance(policy, Mapping):
            body["document"] = dict(policy)
        elif isinstance(policy, Path) or ("\n" not in policy and policy.endswith(".toml")):
            body["toml"] = Path(policy).read_text(encoding="utf-8")  # a file name
        else:
            body["toml"] = policy
        return PolicyRevision.from_json(self._json("PUT", "/policy", json=body))

    def policy_history(self, *, limit: int = 100) -> list[PolicyRevision]:
        """Every revision of the policy, newest first (admins)."""
        rows = self._json("GET", "/policy/revisions", params={"limit": limit})
        return [PolicyRevision.from_json(r) for r in rows]
