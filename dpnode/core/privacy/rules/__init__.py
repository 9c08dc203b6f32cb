"""Per-prim privacy rules; importing this package registers every rule in :data:`RULES`."""

from dpnode.core.privacy.rules import (  # noqa: F401
    conv,
    distinct,
    elementwise,
    linalg,
    misc,
    moments,
    reductions,
    shape,
    unary,
)
from dpnode.core.privacy.rules.base import RULES, Ctx, Rule

__all__ = ["RULES", "Ctx", "Rule"]
