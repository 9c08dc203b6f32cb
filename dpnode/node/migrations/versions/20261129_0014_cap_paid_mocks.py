"""Cap-paid charges and synthetic mocks: a data owner's synthetic mock is paid from the
dataset's cap, not from the owner's budget

``ledger_entries.cap_only`` marks a charge paid from the caps of the datasets it read alone:
it counts against those caps (everyone's rows that read a dataset) but not against its
user's budget, so the trigger that keeps users' totals (0004) skips it. Existing rows are
charges to their users' budgets (false). ``datasets.mock_provenance`` says where a mock came
from when the node synthesized it (``NULL``: uploaded by its owner, or none).

The ledger is append-only (triggers refuse UPDATE and DELETE): adding a column with a
constant default changes no row, so neither fires, and is done in place on both databases
(Alembic's batch mode would copy the table, which on SQLite drops its triggers, see 0009).
On SQLite the totals trigger is created again from its own text with a WHEN clause; on
PostgreSQL it is created again with one.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 16:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HEAD = "AFTER INSERT ON ledger_entries "
_WHEN = "WHEN NOT NEW.cap_only "
_FOUND = sa.text(
    "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'ledger_totals_add'"
)


def _sqlite_trigger(old: str, new: str) -> None:
    """Create the totals trigger again with ``old`` in its text replaced by ``new``."""
    bind = op.get_bind()
    sql = bind.execute(_FOUND).scalar_one()
    assert old in sql, sql
    op.execute("DROP TRIGGER ledger_totals_add")
    bind.exec_driver_sql(sql.replace(old, new, 1))


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column(
        "ledger_entries",
        sa.Column("cap_only", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("datasets", sa.Column("mock_provenance", sa.JSON(), nullable=True))
    if bind.dialect.name == "postgresql":
        op.execute("DROP TRIGGER ledger_totals_add ON ledger_entries")
        op.execute(
            f"CREATE TRIGGER ledger_totals_add {_HEAD}FOR EACH ROW WHEN (NOT NEW.cap_only) "
            "EXECUTE FUNCTION ledger_totals_add()"
        )
    else:
        _sqlite_trigger(_HEAD + "BEGIN", _HEAD + _WHEN + "BEGIN")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("DROP TRIGGER ledger_totals_add ON ledger_entries")
        op.execute(
            f"CREATE TRIGGER ledger_totals_add {_HEAD}FOR EACH ROW "
            "EXECUTE FUNCTION ledger_totals_add()"
        )
    else:
        _sqlite_trigger(_HEAD + _WHEN + "BEGIN", _HEAD + "BEGIN")
    # Going down, a cap-paid row would count against its user: the totals are rebuilt by
    # the trigger's own rule (every row), as 0004 first summed them.
    op.execute("DELETE FROM ledger_totals")
    op.execute(
        "INSERT INTO ledger_totals (user_id, epsilon_units, rho_units, tv_units, newest_at) "
        "SELECT user_id, sum(epsilon_units), sum(rho_units), sum(tv_units), max(at) "
        "FROM ledger_entries GROUP BY user_id"
    )
    op.drop_column("datasets", "mock_provenance")
    op.drop_column("ledger_entries", "cap_only")
