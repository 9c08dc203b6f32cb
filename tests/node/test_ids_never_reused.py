"""A deleted row's id is never given to a new row (through the real app, on both databases).

Reported: on SQLite, deleting the newest dataset handed its id to the next upload, so an
admin's approval of a publish naming ``dataset:7`` let that publish run on the dataset
uploaded next (other data, other bounds), and ``GET /ledger?dataset_id=7`` listed the charges
of both. SQLite gives a new row the largest id plus one unless the table is AUTOINCREMENT;
PostgreSQL's sequences never reuse one. The migration test builds a database at revision
0007, deletes rows, and upgrades it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from httpx import Response
from sqlalchemy import Connection, Engine, Integer, inspect, text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.base import Base
from dpnode.node.db.migrate import alembic_config, check, upgrade
from dpnode.node.db.session import make_engine
from dpnode.node.settings import Settings
from tests.conftest import login, make_user
from tests.node.conftest import publish, refused, upload_model, upload_ok

N = 50


def _dataset(
    http: TestClient, headers: dict[str, str], name: str, upper: float, **manifest: Any
) -> int:
    x = np.linspace(0, upper, N)
    body = upload_ok(http, headers, name, {"x": x}, bounds={"x": (0, upper)}, **manifest)
    return int(body["id"])


def _sum_frame(dataset_id: int) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (N,))
    return encode(b.build([b.op("sum", x)]))


def _delete(http: TestClient, headers: dict[str, str], path: str) -> None:
    response = http.delete(path, headers=headers)
    assert response.status_code == 204, response.text


def _ok(response: Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_the_newest_dataset_deleted_its_id_is_not_given_to_the_next_upload(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    first = _dataset(http, owner_h, "visits", 1.0)
    newest = _dataset(http, owner_h, "admissions", 1.0)
    _delete(http, owner_h, f"/api/v1/datasets/{newest}")
    again = _dataset(http, owner_h, "admissions", 1.0)
    assert again not in (first, newest) and again > newest
    refused(http.get(f"/api/v1/datasets/{newest}", headers=owner_h), 404, "not_found")


def test_the_newest_model_deleted_its_id_is_not_given_to_the_next_upload(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    w = np.ones(3, dtype=np.float32)
    newest = _ok(upload_model(http, owner_h, "m", {"w": w}))["id"]
    _delete(http, owner_h, f"/api/v1/models/{newest}")
    assert _ok(upload_model(http, owner_h, "m", {"w": w}))["id"] > newest


def test_an_approval_naming_a_deleted_dataset_does_not_apply_to_the_next_upload(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    old = _dataset(http, owner_h, "visits", 1.0)
    toml = "[approval]\nepsilon_above = 0.5\n"
    assert http.put(
        "/api/v1/policy", json={"toml": toml, "reason": "r"}, headers=admin_h
    ).is_success
    frame = _sum_frame(old)
    waiting = publish(http, ds_h, frame, 0.8)
    assert waiting.status_code == 403 and waiting.json()["error"] == "approval_required"
    approval = waiting.json()["approval_id"]
    reason = {"reason": "the visits of 2025, bounded by 1"}
    _ok(http.post(f"/api/v1/publish/approvals/{approval}/approve", json=reason, headers=admin_h))
    # The owner replaces the dataset: same name, wider bounds.
    _delete(http, owner_h, f"/api/v1/datasets/{old}")
    new = _dataset(http, owner_h, "visits", 1000.0)
    assert new != old
    # The approved frame still names the deleted dataset: nothing runs, nothing is charged,
    # and the approval is not used up.
    refused(publish(http, ds_h, frame, 0.8), 404, "not_found")
    assert _ok(http.get("/api/v1/ledger", headers=ds_h)) == []
    (row,) = _ok(http.get("/api/v1/publish/approvals", headers=admin_h))
    assert (row["id"], row["status"], row["dataset_ids"]) == (approval, "approved", [old])
    # The new dataset waits for an approval of its own.
    fresh = publish(http, ds_h, _sum_frame(new), 0.8)
    assert fresh.status_code == 403 and fresh.json()["error"] == "approval_required"
    assert fresh.json()["approval_id"] != approval


def test_the_ledger_filtered_by_a_deleted_dataset_shows_only_its_charges(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    old = _dataset(http, owner_h, "visits", 1.0)
    first = publish(http, ds_h, _sum_frame(old), 0.25)
    assert first.status_code == 200, first.text
    _delete(http, owner_h, f"/api/v1/datasets/{old}")
    new = _dataset(http, owner_h, "visits", 1000.0)
    assert publish(http, ds_h, _sum_frame(new), 0.5).status_code == 200
    for headers, extra in ((ds_h, ""), (admin_h, "&all_users=true")):
        charges = _ok(http.get(f"/api/v1/ledger?dataset_id={old}{extra}", headers=headers))
        assert [(c["dataset_ids"], c["epsilon"]) for c in charges] == [([old], 0.25)]
        charges = _ok(http.get(f"/api/v1/ledger?dataset_id={new}{extra}", headers=headers))
        assert [(c["dataset_ids"], c["epsilon"]) for c in charges] == [([new], 0.5)]


# -- the schema and its migration (SQLite: PostgreSQL's sequences never reuse an id) ----------

#: Every table with an integer id of its own (not a foreign key, not part of a composite key).
OWN_IDS = sorted(
    t.name
    for t in Base.metadata.tables.values()
    if len(t.primary_key.columns) == 1
    and all(isinstance(c.type, Integer) and not c.foreign_keys for c in t.primary_key.columns)
)


def _autoincrement(connection: Connection) -> set[str]:
    rows = connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    return {name for name, sql in rows if "AUTOINCREMENT" in sql.upper()}


def test_every_table_with_an_id_of_its_own_never_reuses_one_on_sqlite(
    sqlite_template: Path,
) -> None:
    assert {"users", "datasets", "models", "publish_approvals", "ledger_entries"} <= set(OWN_IDS)
    for name in OWN_IDS:
        assert Base.metadata.tables[name].dialect_options["sqlite"]["autoincrement"], name
    engine = make_engine(f"sqlite:///{sqlite_template}")
    try:
        with engine.connect() as connection:
            assert _autoincrement(connection) == set(OWN_IDS)
    finally:
        engine.dispose()


def _schema(engine: Engine) -> dict[str, Any]:
    """Everything about each table but whether its ids are AUTOINCREMENT."""
    found = inspect(engine)
    out: dict[str, Any] = {}
    for name in sorted(found.get_table_names()):
        if name.startswith("sqlite_"):
            continue
        out[name] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], c["default"])
                for c in found.get_columns(name)
            ],
            "pk": found.get_pk_constraint(name)["constrained_columns"],
            "fks": sorted(
                (
                    f["name"],
                    f["constrained_columns"],
                    f["referred_table"],
                    sorted(f["options"].items()),
                )
                for f in found.get_foreign_keys(name)
            ),
            "unique": sorted(
                (u["name"], u["column_names"]) for u in found.get_unique_constraints(name)
            ),
            "indexes": sorted(
                (i["name"], i["column_names"], i["unique"]) for i in found.get_indexes(name)
            ),
        }
    with engine.connect() as connection:
        triggers = text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
        out["triggers"] = {name: sql for name, sql in connection.execute(triggers)}
    return out


def _rows(engine: Engine) -> dict[str, list[Any]]:
    with engine.connect() as connection:
        names = inspect(connection).get_table_names()
        return {
            name: [
                tuple(r) for r in connection.execute(text(f"SELECT * FROM {name} ORDER BY 1, 2"))
            ]
            for name in names
            if name not in ("alembic_version", "sqlite_sequence")
        }


def _node(settings: Settings) -> tuple[NodeContext, TestClient]:
    context = NodeContext.from_settings(settings)
    return context, TestClient(create_app(context=context))


def test_a_database_at_0007_upgraded_keeps_its_rows_and_never_reuses_an_id(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'dpnode.sqlite3'}"
    upgrade(url)  # the node writes the rows it writes today, then goes back to 0007
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=url,
        argon2_memory_kib=8 * 1024,
        argon2_time_cost=1,
    )
    # The node as it was: datasets 1 to 3 and models 1 and 2, the newest of each deleted
    # once the ledger, an approval and the audit log named them.
    context, http = _node(settings)
    with http:
        make_user(context, "admin@example.org", "admin")
        make_user(context, "owner@example.org", "data_owner")
        make_user(context, "ds@example.org", "data_scientist")
        admin_h, owner_h = login(http, "admin@example.org"), login(http, "owner@example.org")
        ds_h = login(http, "ds@example.org")
        ids = [_dataset(http, owner_h, name, 1.0, tags=["kept"]) for name in ("a", "b", "c")]
        assert ids == [1, 2, 3]
        assert publish(http, ds_h, _sum_frame(3), 0.25).status_code == 200
        toml = "[approval]\nepsilon_above = 0.5\n"
        policy = {"toml": toml, "reason": "r"}
        assert http.put("/api/v1/policy", json=policy, headers=admin_h).is_success
        assert publish(http, ds_h, _sum_frame(3), 0.8).json()["error"] == "approval_required"
        _delete(http, owner_h, "/api/v1/datasets/3")
        w = np.ones(2, dtype=np.float32)
        models = [_ok(upload_model(http, owner_h, m, {"w": w}))["id"] for m in ("m", "n")]
        assert models == [1, 2]
        _delete(http, owner_h, "/api/v1/models/2")
    context.close()
    command.downgrade(alembic_config(url), "0007")

    engine = make_engine(url)
    try:
        before, rows = _schema(engine), _rows(engine)
        # Dataset 3's column and tag went with it; the others' are what a rebuild must keep.
        assert len(rows["dataset_columns"]) == len(rows["dataset_tags"]) == 2
        engine.dispose()
        upgrade(url, "0008")
        assert _rows(engine) == rows
        assert _schema(engine) == before
        with engine.connect() as connection:
            # the tables of 0008 (training_runs and later ones come with later revisions)
            assert _autoincrement(connection) == set(OWN_IDS) & set(before)
            seq = text("SELECT name, seq FROM sqlite_sequence")
            sequence = {name: n for name, n in connection.execute(seq)}
        # Datasets start above 3: the ledger, the approval and the audit log name it.
        assert (sequence["datasets"], sequence["models"], sequence["users"]) == (3, 2, 3)
        # The triggers came back with their tables: the ledger is still append-only.
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(text("DELETE FROM ledger_entries"))

        # Downgraded, the tables are as they were at 0007, rows and all.
        engine.dispose()
        command.downgrade(alembic_config(url), "0007")
        assert _rows(engine) == rows
        assert _schema(engine) == before
        with engine.connect() as connection:
            assert _autoincrement(connection) == set()
            assert connection.execute(text("SELECT count(*) FROM sqlite_sequence")).scalar() == 0
        engine.dispose()
        upgrade(url)
        check(url)  # the models and the migrations agree
    finally:
        engine.dispose()

    context, http = _node(settings)
    try:
        with http:
            owner_h = login(http, "owner@example.org")
            assert _dataset(http, owner_h, "c", 1000.0) == 4
            assert _ok(upload_model(http, owner_h, "n", {"w": w}))["id"] == 3
            ds_h = login(http, "ds@example.org")
            # The approval and the ledger name dataset 3, which no longer exists.
            refused(publish(http, ds_h, _sum_frame(3), 0.8), 404, "not_found")
            (charge,) = _ok(http.get("/api/v1/ledger?dataset_id=3", headers=ds_h))
            assert charge["epsilon"] == 0.25
            assert _ok(http.get("/api/v1/ledger?dataset_id=4", headers=ds_h)) == []
    finally:
        context.close()
