"""Budget policies: documents, validation and pure evaluation (no I/O, no node imports).

Modules (private; everything public is re-exported here):

* ``_document`` — the policy document (pydantic), TOML/JSON loading, canonical form and hash;
* ``_errors`` — :class:`PolicyError`, naming every offending key;
* ``_units``, ``_periods``, ``_conversion`` — ledger units, renewal periods, rho -> epsilon;
* ``_records`` — what the node passes in (users, charges, requests, grants, approvals) and
  what it gets back (:class:`Decision`);
* ``_budget``, ``_rules``, ``_evaluate`` — allocations, the rule registry, :func:`decide`.

The node imports this package, never the reverse. See ``docs/policies.md``.
"""

from dpnode.policies._budget import Allocation, Limit, Spent, allocation_for, apply_grant
from dpnode.policies._caps import CapStatus, cap_status
from dpnode.policies._conversion import ORDERS, RhoToEpsilon, bun_steinke, filter_epsilon
from dpnode.policies._document import (
    ROLES,
    SCHEMA_VERSION,
    Amounts,
    ApprovalThresholds,
    DatasetCap,
    Policy,
    PublishCaps,
    RateLimit,
    Renewal,
    Roles,
    default_policy,
    load_policy,
    load_policy_file,
)
from dpnode.policies._errors import PolicyError
from dpnode.policies._evaluate import (
    BudgetStatus,
    LedgerScope,
    budget_status,
    decide,
    decide_approved,
    decide_cap,
    decide_run,
    ledger_scope,
    run_total,
)
from dpnode.policies._periods import Period, format_period, parse_period
from dpnode.policies._records import (
    Allowance,
    Approval,
    Charge,
    Decision,
    Grant,
    Outcome,
    PublishRequest,
    Remaining,
    RunRequest,
    User,
)
from dpnode.policies._rules import RULES
from dpnode.policies._units import (
    DELTA_UNIT,
    EPSILON_UNIT,
    RHO_UNIT,
    decimal,
    delta_units,
    epsilon_units,
    in_float,
    units_down,
    units_up,
)

__all__ = [
    "DELTA_UNIT",
    "EPSILON_UNIT",
    "ORDERS",
    "RHO_UNIT",
    "ROLES",
    "RULES",
    "SCHEMA_VERSION",
    "Allocation",
    "Allowance",
    "Amounts",
    "Approval",
    "ApprovalThresholds",
    "BudgetStatus",
    "CapStatus",
    "Charge",
    "DatasetCap",
    "Decision",
    "Grant",
    "LedgerScope",
    "Limit",
    "Outcome",
    "Period",
    "Policy",
    "PolicyError",
    "PublishCaps",
    "PublishRequest",
    "RateLimit",
    "Remaining",
    "Renewal",
    "RhoToEpsilon",
    "Roles",
    "RunRequest",
    "Spent",
    "User",
    "allocation_for",
    "apply_grant",
    "budget_status",
    "bun_steinke",
    "cap_status",
    "decide",
    "decide_approved",
    "decide_cap",
    "decide_run",
    "decimal",
    "default_policy",
    "delta_units",
    "epsilon_units",
    "filter_epsilon",
    "format_period",
    "in_float",
    "ledger_scope",
    "load_policy",
    "load_policy_file",
    "parse_period",
    "run_total",
    "units_down",
    "units_up",
]
