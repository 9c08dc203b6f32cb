"""Transactions are owned by services: the HTTP layer never commits, rolls back or begins one.

Import boundaries are checked by import-linter (``scripts/check``); a method call is not an
import, so this reads the HTTP layer's code instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "dpnode" / "node" / "api"
TRANSACTION_CALLS = {"commit", "rollback", "begin", "begin_nested", "flush"}


def transaction_calls(source: str) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.func.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in TRANSACTION_CALLS
    ]


def test_the_check_sees_a_commit() -> None:
    assert transaction_calls("def f(session):\n    session.commit()\n") == [(2, "commit")]


def test_routes_and_dependencies_leave_transactions_to_services() -> None:
    found = {
        f"{path.relative_to(API)}:{line}": call
        for path in sorted(API.rglob("*.py"))
        for line, call in transaction_calls(path.read_text(encoding="utf-8"))
    }
    assert found == {}
