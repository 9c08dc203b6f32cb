"""A publish on a dataset its process has computed on reads no metadata: the charge checks,
under its lock, that the dataset and the account still are (``KnownDatasets``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from sqlalchemy import event, func, select
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, User
from dpnode.node.services import datasets
from tests.conftest import login
from tests.node.conftest import publish, refused, upload_ok

GONE = "this account no longer exists or is deactivated"


def _mean(dataset_id: int, column: str = "x") -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/{column}", "float64", (40,))
    return encode(b.build([b.op("mean", x)]))


@pytest.fixture
def known(http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]) -> int:
    """A dataset published on once: its process knows it."""
    data = {"x": np.random.default_rng(3).uniform(0, 1, 40)}
    ident = int(upload_ok(http, owner_h, "known", data, bounds={"x": (0, 1)})["id"])
    assert publish(http, ds_h, _mean(ident), 0.1).status_code == 200
    return ident


@contextmanager
def statements(context: NodeContext) -> Iterator[list[str]]:
    """Every statement the node's main pool runs meanwhile."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *rest: object) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(context.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(context.engine, "before_cursor_execute", record)


def _charges(context: NodeContext) -> int:
    with context.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(LedgerEntry)) or 0)


def test_a_publish_on_a_known_dataset_runs_only_its_charge(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], known: int
) -> None:
    with statements(context) as seen:
        assert publish(http, ds_h, _mean(known), 0.1).status_code == 200
    begins = [s for s in seen if s.startswith("BEGIN")]
    postgres = context.engine.dialect.name == "postgresql"
    assert begins == ([] if postgres else ["BEGIN IMMEDIATE"])  # PostgreSQL's BEGIN is implicit
    assert not any("dataset_columns" in s for s in seen)  # no metadata read
    assert _charges(context) == 2


def test_a_known_dataset_deleted_since_is_refused_uncharged_and_forgotten(
    http: TestClient,
    context: NodeContext,
    owner: User,
    ds_h: dict[str, str],
    known: int,
) -> None:
    """No policy caps the dataset: the charge refuses it all the same, where a publish used to
    be charged and answered with its stand-ins when the dataset went during the publish."""
    with context.sessions() as session:
        datasets.delete_dataset(session, context.store, owner, known)
    assert context.known_datasets.get(known) is not None  # deleted by this process, even
    detail = refused(publish(http, ds_h, _mean(known), 0.1), 404, "not_found")
    assert detail == f"dataset {known} was deleted while this publish ran; nothing was released"
    assert _charges(context) == 1
    assert context.known_datasets.get(known) is None
    refused(publish(http, ds_h, _mean(known), 0.1), 404, "not_found")  # read: no such dataset
    assert _charges(context) == 1


def test_another_process_deleting_a_known_dataset_is_seen_by_the_charge(
    http: TestClient, context: NodeContext, owner: User, ds_h: dict[str, str], known: int
) -> None:
    other = NodeContext.from_settings(context.settings)  # a second worker on the same database
    try:
        with other.sessions() as session:
            datasets.delete_dataset(session, other.store, owner, known)
    finally:
        other.close()
    refused(publish(http, ds_h, _mean(known), 0.1), 404, "not_found")
    assert _charges(context) == 1


@pytest.mark.parametrize("graph", ["valid", "unknown column", "bad epsilon"])
def test_a_deactivated_account_is_told_only_that_on_a_known_dataset(
    http: TestClient,
    context: NodeContext,
    admin_h: dict[str, str],
    scientist: User,
    known: int,
    graph: str,
) -> None:
    """Its token still verifies; without the read before the work, every refusal and the
    charge check the account first: it learns nothing of the dataset's columns or bounds."""
    token = login(http, scientist.email)
    update = http.patch(f"/api/v1/users/{scientist.id}", json={"is_active": False}, headers=admin_h)
    assert update.status_code == 200
    frame = _mean(known, "nope" if graph == "unknown column" else "x")
    epsilon = -1.0 if graph == "bad epsilon" else 0.1
    assert refused(publish(http, token, frame, epsilon), 401, "unauthenticated") == GONE
    assert _charges(context) == 1
