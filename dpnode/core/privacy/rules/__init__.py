"""Per-prim privacy rules; importing this package registers every rule in :data:`RULES`."""

from node.privacy.rules import (  # noqa: F401
    conv,
    elementwise,
    linalg,
    misc,
    moments,
    reductions,
    shape,
    unary,
)
from node.privacy.rules.base import RULES, Ctx, Rule

__all__ = ["RULES", "Ctx", "Rule"]
