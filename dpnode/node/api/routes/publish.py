from __future__ import annotations

import logging
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, BackgroundTasks, Query, Response
from starlette.concurrency import run_in_threadpool

from dpnode.node.api import frames
from dpnode.node.api.deps import (
    ContextDep,
    CurrentUser,
    IdempotencyKey,
    LimitedBody,
    ReadSessionDep,
    TokenUserId,
)
from dpnode.node.api.numbers import IntegerText, NumberText
from dpnode.node.api.openapi import GRAPH_FRAME, errors, frame_body, frame_response
from dpnode.node.api.schemas import OutputSensitivityPublic, PublishKeyPublic, SensitivityPublic
from dpnode.node.context import NodeContext
from dpnode.node.db.models import MAX_ID
from dpnode.node.services import idempotency
from dpnode.node.services import publish as service
from dpnode.node.services.approvals import MAX_DESCRIPTION

router = APIRouter(tags=["publish"])
log = logging.getLogger("dpnode")

Epsilon = Annotated[
    float, Query(description="privacy loss to spend; > 0", allow_inf_nan=True), NumberText
]
Delta = Annotated[
    float | None,
    Query(description="omit for Laplace (pure epsilon); set for Gaussian"),
    NumberText,
]


@router.post(
    "/publish",
    response_class=Response,
    responses=frame_response(
        "the noised outputs, `output/<i>` tensors, and the receipt in the manifest"
    )
    | errors(403, 404, 409),
    openapi_extra=frame_body(GRAPH_FRAME),
)
async def publish(
    body: LimitedBody,
    context: ContextDep,
    user_id: TokenUserId,
    epsilon: Epsilon,
    background: BackgroundTasks,
    delta: Delta = None,
    run: Annotated[
        int | None,
        Query(
            ge=0,
            le=MAX_ID,
            description="the training run this publish is a step of (POST /publish/runs)",
        ),
        IntegerText,
    ] = None,
    description: Annotated[
        str,
        Query(
            max_length=MAX_DESCRIPTION,
            description="what the publish is for, in your words: shown to the admin who "
            "approves it and kept in your ledger row",
        ),
    ] = "",
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Evaluate a graph (engine wire frame as the body) on private data and release its
    outputs with noise, charging ``epsilon`` (and ``delta``) to your budget.

    The response is a tensor frame: ``output/<i>`` for each graph output, and the receipt
    in the manifest.
    """
    arrived = time.monotonic()
    request = service.PublishRequest(
        epsilon=epsilon, delta=delta, run_id=run, description=description.strip()
    )
    done = await run_in_threadpool(
        service.publish, context, user_id, body, request, idempotency_key
    )
    if isinstance(done, service.Replayed):
        return Response(done.body, media_type=frames.MEDIA_TYPE)
    try:
        arrays = {f"output/{i}": v for i, v in enumerate(done.values)}
        content = frames.encode(arrays, {"receipt": done.receipt})
    except BaseException:
        if idempotency_key is not None:  # no answer to store: its retries learn it is lost
            service.let_go(context, user_id, idempotency_key)
        raise
    if idempotency_key is not None or done.failure is not None:
        # After the answer is sent: the client does not wait for a second commit, and the
        # answer's time does not show a failure. A retry arriving before the answer is stored
        # is told the publish still runs and waits.
        background.add_task(_after_answer, context, user_id, idempotency_key, content, done)
    quantum = context.settings.publish_time_quantum_seconds
    if quantum > 0:  # the answer's time shows only which doubling of the quantum it needed
        await anyio.sleep(service.answer_delay(quantum, time.monotonic() - arrived))
    return Response(content, media_type=frames.MEDIA_TYPE)


def _after_answer(
    context: NodeContext,
    user_id: int,
    key: str | None,
    content: bytes,
    done: service.Published,
) -> None:
    """Store the answer under its key, then tell the operator of a failed evaluation: in
    that order, each whatever the other does (a key whose answer is never stored stays
    ``running`` until it expires, and its retries wait)."""
    ledger_id = done.receipt["ledger_id"]
    if key is not None:
        try:
            service.answered(context, user_id, key, content)
        except Exception:  # charged and answered: a retry is told it runs until it expires
            log.exception("could not store the answer of publish %s", ledger_id)
    try:
        service.record_failure(context, user_id, done)
    except Exception:
        log.exception("could not record the failed evaluation of publish %s", ledger_id)


@router.get("/publish/keys/{key}", responses=errors(404, 422))
def publish_state(key: str, session: ReadSessionDep, actor: CurrentUser) -> PublishKeyPublic:
    """Where your publish under idempotency key ``key`` stands: ``running`` (charged, being
    evaluated), ``answered`` (send it again with the same key: the stored answer, charged
    once) or ``lost`` (charged, and the node process computing it stopped before its answer
    was stored: not released again). A long publish is a job the SDK polls here while it
    waits."""
    found = idempotency.state(session, actor.id, key)
    return PublishKeyPublic(
        key=found.key,
        state="answered" if found.answered else "lost" if found.lost else "running",
        ledger_id=found.ledger_id,
        created_at=found.created_at,
    )


@router.post("/sensitivity", responses=errors(403, 404), openapi_extra=frame_body(GRAPH_FRAME))
async def sensitivity(
    body: LimitedBody,
    context: ContextDep,
    user_id: TokenUserId,
    epsilon: Annotated[float | None, Query(), NumberText] = None,
    delta: Delta = None,
) -> SensitivityPublic:
    """Sensitivity of a graph's outputs (and the noise scale for ``epsilon``): free."""
    report = await run_in_threadpool(service.sensitivity, context, user_id, body)
    scale = None
    if epsilon is not None:
        scale = service.noise_scale(report, service.PublishRequest(epsilon, delta))
    return SensitivityPublic(
        l1=report.l1,
        l2=report.l2,
        subjects=report.subjects,
        outputs=[
            OutputSensitivityPublic(
                shape=list(o.shape),
                l1=o.l1,
                l2=o.l2,
                lower=float(o.lower.min()) if o.lower.size else 0.0,
                upper=float(o.upper.max()) if o.upper.size else 0.0,
                rounding_l1=o.rounding_l1,
                rounding_l2=o.rounding_l2,
            )
            for o in report.outputs
        ],
        noise_scale=scale,
    )
