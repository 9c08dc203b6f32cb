from __future__ import annotations

from fastapi import APIRouter

from node.api.deps import ContextDep, CurrentUser
from node.api.schemas import RunPlanCreate, RunPlanPublic
from node.services import runs

router = APIRouter(prefix="/publish/runs", tags=["publish"])


@router.post("")
def plan_run(body: RunPlanCreate, context: ContextDep, user: CurrentUser) -> RunPlanPublic:
    """Plan a training run before its first step: the policy judges it as a whole.

    Refused (``budget_exceeded``, ``policy_refused``) when its total does not fit or a step
    is over a per-publish cap; ``approval_required`` with a request id when its total is
    above an approval threshold. Once that is approved, planning the same run again returns
    its ``run_id``, which each step's ``POST /publish`` names as ``run=``.
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
