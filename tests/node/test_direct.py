"""Statements run on the cursor (dpnode.node.db.direct) store and read exactly what
SQLAlchemy's own execution does, on both databases, and refuse what they do not do.

The charge writes the ledger through them: a value stored in another format (a time as text
that SQLite compares as text, a JSON list) would be read back wrong by every other reader of
the ledger, so each statement the node runs directly is compared, stored value for stored
value, with the same statement run by ``Connection.execute``.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Connection,
    Engine,
    Enum,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    event,
    exc,
    insert,
    select,
    text,
    update,
)

from dpnode.node.context import NodeContext
from dpnode.node.db.base import UTCDateTime
from dpnode.node.db.direct import Direct
from dpnode.node.db.models import AuditEvent, LedgerEntry, LedgerEntryDataset, PublishKey, User
from dpnode.node.services import audit, charge_rows, idempotency, ledger_sums


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


_META = MetaData()
_KINDS = Table(
    "direct_kinds",
    _META,
    Column("id", Integer, primary_key=True),
    Column("at", UTCDateTime(), nullable=True),
    Column("doc", JSON, nullable=True),
    Column("colour", Enum(Colour, native_enum=False, length=8), nullable=True),
    Column("flag", Boolean, nullable=True),
    Column("blob", LargeBinary, nullable=True),
    Column("name", String(40), unique=True),
    Column("made", Integer, default=7),  # a Python default: Direct must be given it
)
_KEYS = ("at", "doc", "colour", "flag", "blob", "name", "made")
ROWS: list[dict[str, Any]] = [
    {
        "at": datetime(2026, 11, 27, 15, 4, 5, 123456, tzinfo=UTC),
        "doc": {"b": [1, 2.5, None], "a": "é\n", "n": {"deep": True}},
        "colour": Colour.BLUE,
        "flag": False,
        "blob": b"\x00\xff" * 20,
    },
    {"at": None, "doc": None, "colour": None, "flag": None, "blob": None},
    {
        "at": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=1),
        "doc": [],
        "colour": Colour.RED,
        "flag": True,
        "blob": b"",
    },
]


@pytest.fixture
def engine(context: NodeContext) -> Engine:
    _META.create_all(context.engine)
    return context.engine


def _stored(conn: Connection, name: str) -> tuple[Any, ...]:
    """The row as the database holds it (the driver's values, no SQLAlchemy types)."""
    row = conn.exec_driver_sql(
        "SELECT at, doc, colour, flag, blob FROM direct_kinds WHERE name = "
        + ("?" if conn.dialect.name == "sqlite" else "%(name)s"),
        ("@" + name,) if conn.dialect.name == "sqlite" else {"name": "@" + name},
    ).one()
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_a_row_is_stored_and_read_as_sqlalchemy_stores_and_reads_it(
    engine: Engine, index: int
) -> None:
    row = ROWS[index]
    direct = Direct(insert(_KINDS).returning(_KINDS.c.id, _KINDS.c.at, _KINDS.c.colour), _KEYS)
    query = select(_KINDS.c.at, _KINDS.c.doc, _KINDS.c.colour, _KINDS.c.flag, _KINDS.c.blob)
    by_name = query.where(_KINDS.c.name == bindparam("name"))
    with engine.begin() as conn:
        conn.execute(insert(_KINDS), {**row, "name": f"@core{index}", "made": 7})
        ((ident, at, colour),) = direct.execute(conn, {**row, "name": f"@direct{index}", "made": 7})
        assert isinstance(ident, int)
        assert (at, colour) == (row["at"], row["colour"])  # RETURNING, processed
        assert _stored(conn, f"direct{index}") == _stored(conn, f"core{index}")
        core = conn.execute(by_name, {"name": f"@core{index}"}).one()
        read = Direct(by_name).execute(conn, {"name": f"@core{index}"})
        assert read == [tuple(core)]
        assert [type(v) for v in read[0]] == [type(v) for v in core]
        assert read[0] == tuple(row[k] for k in ("at", "doc", "colour", "flag", "blob"))


def test_the_node_s_own_direct_statements_write_what_the_orm_reads(
    context: NodeContext, scientist: User
) -> None:
    """A charge's ledger row, its dataset, key and audit line, written directly, read back
    through the ORM models every other part of the node reads them with."""
    at = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
    values = {
        "at": at,
        "user_id": scientist.id,
        "mechanism": "laplace",
        "epsilon_units": 5,
        "rho_units": 0,
        "tv_units": 3,
        "dataset_ids": [4, 9],
        "graph_hash": "ab" * 32,
        "detail": {"shape": [1], "q": 0.5},
        "policy_revision": None,
        "run_id": None,
        "cap_only": False,
    }
    with context.serial_sessions() as session:
        conn = session.connection()
        ((ledger_id,),) = charge_rows.INSERT_LEDGER.execute(conn, values)
        reads = [{"ledger_id": ledger_id, "dataset_id": d, "dataset_name": None} for d in (4, 9)]
        charge_rows.INSERT_READS.execute(conn, reads)  # several: executemany
        claim = idempotency.Claim("k-1", "cd" * 32)
        idempotency.record(session, scientist.id, claim, ledger_id, at, 30.0)
        audit.append(session, scientist, "privacy.charge", target_id=ledger_id, x=[1.5])
        session.commit()
    with context.sessions() as session:
        entry = session.get(LedgerEntry, ledger_id)
        assert entry is not None
        assert {k: getattr(entry, k) for k in values} == values
        pairs = session.scalars(
            select(LedgerEntryDataset).where(LedgerEntryDataset.ledger_id == ledger_id)
        ).all()
        assert sorted(p.dataset_id for p in pairs) == [4, 9]
        key = session.scalars(select(PublishKey).where(PublishKey.key == "k-1")).one()
        assert (key.created_at, key.lease_until) == (at, at + timedelta(seconds=30))
        mine = AuditEvent.action == "privacy.charge"
        line = session.scalars(select(AuditEvent).where(mine)).one()
        assert (line.target_id, line.detail, line.actor_id) == (
            ledger_id,
            {"x": [1.5]},
            scientist.id,
        )
        assert line.at.tzinfo is not None
        # the ledger's kept total (a trigger) saw the row
        total = session.execute(ledger_sums._TOTAL, {"user_id": scientist.id}).one()
        assert tuple(total[:3]) == (5, 0, 3)
    idempotency.store(context.relaxed_sessions, scientist.id, "k-1", b"answer")
    with context.sessions() as session:
        assert session.scalars(select(PublishKey.response)).one() == b"answer"


def test_a_duplicate_is_sqlalchemy_s_integrity_error_and_the_transaction_rolls_back(
    engine: Engine,
) -> None:
    direct = Direct(insert(_KINDS), ("name", "made"))
    with engine.connect() as conn:
        conn.begin()
        direct.execute(conn, {"name": "@same", "made": 1})
        with pytest.raises(exc.IntegrityError):
            direct.execute(conn, {"name": "@same", "made": 1})
        conn.rollback()
        with conn.begin():  # the connection is still good
            direct.execute(conn, {"name": "@after", "made": 1})
    with engine.connect() as conn:
        names = conn.execute(select(_KINDS.c.name).order_by(_KINDS.c.name)).scalars().all()
    assert names == ["@after"]


def test_what_direct_does_not_do_is_refused_when_prepared(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValueError, match="Python default"):
            Direct(insert(_KINDS), ("name", "flag")).execute(conn, {})
        expanding = select(_KINDS.c.id).where(_KINDS.c.id.in_(bindparam("ids", expanding=True)))
        with pytest.raises(ValueError, match=r"execution time|expanding"):
            Direct(expanding).execute(conn, {"ids": [1]})
        with pytest.raises(exc.ArgumentError, match="'name'"):
            Direct(insert(_KINDS), ("name", "made")).execute(conn, {"made": 1})
        with pytest.raises(ValueError, match="naive"):  # UTCDateTime's own check ran
            Direct(insert(_KINDS), ("name", "made", "at")).execute(
                conn, {"name": "@n", "made": 1, "at": datetime(2026, 1, 1)}
            )
    with engine.connect() as conn, pytest.raises(exc.InvalidRequestError, match="transaction"):
        Direct(select(_KINDS.c.id)).execute(conn, {})


def test_listeners_see_each_statement_and_bound_values_are_sent(engine: Engine) -> None:
    seen: list[tuple[str, Any]] = []

    def record(conn: object, cursor: object, statement: str, params: Any, *rest: Any) -> None:
        seen.append((statement, params))

    query = select(_KINDS.c.name).where(_KINDS.c.made == 7).order_by(_KINDS.c.name).limit(2)
    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.begin() as conn:
            Direct(insert(_KINDS), ("name", "made")).execute(
                conn, [{"name": f"@{i}", "made": 7} for i in range(3)]
            )
            rows = Direct(query).execute(conn, {})
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert rows == [("@0",), ("@1",)]  # the literal 7 and the LIMIT's 2 were bound
    seen = [s for s in seen if not s[0].startswith("BEGIN")]  # SQLite's, by the begin event
    assert len(seen) == 2 and seen[0][0].startswith("INSERT INTO direct_kinds")
    assert len(seen[0][1]) == 3  # executemany: one parameter set a row


def test_an_update_changes_the_rows_it_names(engine: Engine) -> None:
    with engine.begin() as conn:
        Direct(insert(_KINDS), ("name", "made")).execute(
            conn, [{"name": "@a", "made": 1}, {"name": "@b", "made": 1}]
        )
        rename = (
            update(_KINDS).where(_KINDS.c.name == bindparam("old")).values(flag=bindparam("to"))
        )
        Direct(rename).execute(conn, {"old": "@b", "to": True})
        flags = conn.execute(text("SELECT name, flag FROM direct_kinds ORDER BY name")).all()
    assert [(n, None if f is None else bool(f)) for n, f in flags] == [("@a", None), ("@b", True)]
