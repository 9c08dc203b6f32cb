"""The type-promotion matrix: every binary prim x dtype pair x operand kinds, against torch.

Operand kinds are a tensor with one dimension ("T"), a 0-dim tensor ("Z") and
a Python scalar ("S": True, 3 or 1.5). For each cell the engine's inferred
dtype must equal torch's result dtype, and when torch refuses the cell the
engine must refuse it too. Cells torch cannot express (a Python scalar as the
first argument of a function without a reflected operator) are not counted.
A summary of the counts is asserted and printed.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dpnode.core.engine import GraphBuilder, evaluate, infer
from dpnode.core.engine.prims.elementwise import BINARY_PRIMS
from dpnode.core.errors import DPNodeError
from tests.engine.decomp import NAME_TO_TORCH, TORCH_TO_NAME, to_numpy
from tests.engine.tallies import RESULTS

DTYPE_NAMES = list(NAME_TO_TORCH)
SCALARS: dict[str, bool | int | float] = {"bool": True, "int": 3, "float": 1.5}

#: prim -> (torch function, reflected operator for a scalar first argument or None)
TORCH_FN: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
    "add": (torch.add, operator.add),
    "sub": (torch.sub, operator.sub),
    "mul": (torch.mul, operator.mul),
    "div": (torch.true_divide, operator.truediv),
    "floor_divide": (torch.floor_divide, operator.floordiv),
    "trunc_divide": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), None),
    "remainder": (torch.remainder, operator.mod),
    "fmod": (torch.fmod, None),
    "pow": (torch.pow, operator.pow),
    "maximum": (torch.maximum, None),
    "minimum": (torch.minimum, None),
    "atan2": (torch.atan2, None),
    "hypot": (torch.hypot, None),
    "copysign": (torch.copysign, None),
    "eq": (torch.eq, operator.eq),
    "ne": (torch.ne, operator.ne),
    "lt": (torch.lt, operator.lt),
    "le": (torch.le, operator.le),
    "gt": (torch.gt, operator.gt),
    "ge": (torch.ge, operator.ge),
    "logical_and": (torch.logical_and, None),
    "logical_or": (torch.logical_or, None),
    "logical_xor": (torch.logical_xor, None),
    "bitwise_and": (torch.bitwise_and, operator.and_),
    "bitwise_or": (torch.bitwise_or, operator.or_),
    "bitwise_xor": (torch.bitwise_xor, operator.xor),
    "bitwise_left_shift": (torch.bitwise_left_shift, operator.lshift),
    "bitwise_right_shift": (torch.bitwise_right_shift, operator.rshift),
    "zeta": (torch.special.zeta, None),
    "igamma": (torch.igamma, None),
    "igammac": (torch.igammac, None),
    "nextafter": (torch.nextafter, None),
    "gcd": (torch.gcd, None),
    **{
        name: (getattr(torch.special, name), None)
        for name in (
            *(f"chebyshev_polynomial_{k}" for k in "tuvw"),
            *(f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"),
            "hermite_polynomial_h",
            "hermite_polynomial_he",
            "laguerre_polynomial_l",
            "legendre_polynomial_p",
        )
    },
}


def _operand(kind: str, d: str) -> Any:
    if kind == "S":
        return SCALARS[d]
    shape = (2,) if kind == "T" else ()
    return torch.ones(shape, dtype=NAME_TO_TORCH[d])


def _cells() -> list[tuple[str, str, str, str]]:
    """(kind_a+kind_b, dtype_a, dtype_b) combinations; scalar 'dtypes' are bool/int/float."""
    out = []
    for ka, kb in itertools.product("TZS", repeat=2):
        if ka == kb == "S":
            continue
        da = list(SCALARS) if ka == "S" else DTYPE_NAMES
        db = list(SCALARS) if kb == "S" else DTYPE_NAMES
        for a, b in itertools.product(da, db):
            out.append((ka, kb, a, b))
    return out


CELLS = _cells()


def _engine(prim: str, ka: str, kb: str, a: Any, b: Any) -> tuple[str, np.ndarray[Any, Any]]:
    g = GraphBuilder()
    feed: dict[str, np.ndarray[Any, Any]] = {}
    args: list[Any] = []
    for name, kind, v in (("a", ka, a), ("b", kb, b)):
        if kind == "S":
            args.append(v)
        else:
            args.append(g.input(name, TORCH_TO_NAME[v.dtype], tuple(v.shape)))
            feed[name] = to_numpy(v)
    graph = g.build([g.op(prim, *args)])
    meta = infer(graph)[0]
    value = evaluate(graph, feed)[0]
    return meta.dtype.name, value


@pytest.mark.parametrize("prim", sorted(BINARY_PRIMS))
def test_promotion_matrix(prim: str) -> None:
    fn, reflected = TORCH_FN[prim]
    counts = RESULTS[prim]
    bad: list[str] = []
    for ka, kb, da, db in CELLS:
        a, b = _operand(ka, da), _operand(kb, db)
        cell = f"{prim}({ka}:{da}, {kb}:{db})"
        if ka == "S":
            if reflected is None:
                continue  # torch has no call form for it
            call: Callable[[], Any] = lambda a=a, b=b: reflected(a, b)  # noqa: E731
        else:
            call = lambda a=a, b=b: fn(a, b)  # noqa: E731
        try:
            expected = call()
            want: str | None = TORCH_TO_NAME[expected.dtype]
        except TypeError:
            counts["not expressible"] += 1
            continue  # torch's signature takes no scalar there (e.g. atan2(t, 1.5))
        except (RuntimeError, NotImplementedError):
            want = None
        try:
            got: str | None
            got, value = _engine(prim, ka, kb, a, b)
        except DPNodeError:
            got = None
        if (
            got == want
            and want is not None
            and not np.allclose(
                value.astype(np.float64),
                to_numpy(expected).astype(np.float64),
                rtol=1e-2,
                equal_nan=True,
            )
        ):
            counts["mismatch"] += 1
            bad.append(f"{cell}: value {value} != torch {expected}")
        elif got == want:
            counts["match" if want else "both refuse"] += 1
        else:
            counts["mismatch"] += 1
            bad.append(f"{cell}: torch {want or 'refuses'}, engine {got or 'refuses'}")
    assert not bad, f"{len(bad)} cells differ:\n" + "\n".join(bad[:40])


def test_cell_count() -> None:
    # 8 operand-kind pairs: 4 tensor/0-dim pairs of 10x10 dtypes, 4 with a scalar of 10x3
    assert len(CELLS) == 4 * 100 + 4 * 30


def _engine_any(prim: str, operands: list[tuple[str, Any]]) -> str | None:
    """Infer-and-run ``prim`` over (kind, value) operands; None when the engine refuses."""
    g = GraphBuilder()
    feed: dict[str, np.ndarray[Any, Any]] = {}
    args: list[Any] = []
    for i, (kind, v) in enumerate(operands):
        if kind in ("S", "N"):
            args.append(v)
        else:
            args.append(g.input(f"t{i}", TORCH_TO_NAME[v.dtype], tuple(v.shape)))
            feed[f"t{i}"] = to_numpy(v)
    graph = g.build([g.op(prim, *args)])
    try:
        name = infer(graph)[0].dtype.name
        evaluate(graph, feed)
    except DPNodeError:
        return None
    return name


def _torch_any(call: Callable[[], Any]) -> str | None:
    try:
        return TORCH_TO_NAME[call().dtype]
    except (RuntimeError, NotImplementedError):
        return None


def test_where_promotion_matrix() -> None:
    cond = torch.tensor([True, False])
    bad = []
    n = 0
    for ka, kb in itertools.product("TZS", repeat=2):
        da = list(SCALARS) if ka == "S" else DTYPE_NAMES
        db = list(SCALARS) if kb == "S" else DTYPE_NAMES
        for x, y in itertools.product(da, db):
            a, b = _operand(ka, x), _operand(kb, y)
            want = _torch_any(lambda a=a, b=b: torch.where(cond, a, b))
            got = _engine_any("where", [("T", cond), (ka, a), (kb, b)])
            n += 1
            if got != want:
                bad.append(f"where(T:bool, {ka}:{x}, {kb}:{y}): torch {want}, engine {got}")
    RESULTS["where"]["match"] = n - len(bad)
    assert not bad, "\n".join(bad[:40])


def test_clamp_promotion_matrix() -> None:
    bad = []
    n = 0
    for kx, kb in itertools.product("TZ", "TZS"):
        bounds = list(SCALARS) if kb == "S" else DTYPE_NAMES
        for dx, db in itertools.product(DTYPE_NAMES, bounds):
            x, lo = _operand(kx, dx), _operand(kb, db)
            for side in ("min", "max"):
                if side == "min":
                    want = _torch_any(lambda x=x, lo=lo: torch.clamp(x, min=lo))
                    ops = [(kx, x), (kb, lo), ("N", None)]
                else:
                    want = _torch_any(lambda x=x, lo=lo: torch.clamp(x, max=lo))
                    ops = [(kx, x), ("N", None), (kb, lo)]
                got = _engine_any("clamp", ops)
                n += 1
                if got != want:
                    bad.append(f"clamp({kx}:{dx}, {side}={kb}:{db}): torch {want}, engine {got}")
    RESULTS["clamp"]["match"] = n - len(bad)
    assert not bad, "\n".join(bad[:40])
