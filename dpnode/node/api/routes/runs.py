from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.api.deps import ContextDep, CurrentUser
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import RunPlanCreate, RunPlanPublic
from dpnode.node.services import runs

router = APIRouter(prefix="/publish/runs", tags=["publish"])


@router.post("", responses=errors(403, 404))
def plan_run(body: RunPlanCreate, context: ContextDep, user: CurrentUser) -> RunPlanPublic:
    """Plan a training run before its first step: the policy judges it as a whole.

    Refused (``budget_exceeded``, ``policy_refused``) when its total does not fit or a step
    is over a per-publish cap; ``approval_required`` with a request id when its total is
    above an approval threshold; once that is approved, planning the same run again lets it
    start. A run allowed to start is recorded: each step's ``POST /publish`` names its
    ``run_id`` as ``run=``, and the ledger shows its steps as one line
    (``GET /ledger/grouped``). Planning the same run again before its first step names the
    same run.
    """
    plan = runs.RunPlan(
        steps=body.steps,
        epsilon=body.epsilon,
        delta=body.delta,
        values=body.values,
        dataset_ids=tuple(body.dataset_ids),
        description=body.description,
    )
    planned = runs.plan(context.serial_sessions, context.settings, user.id, plan)
    return RunPlanPublic(**vars(planned))
