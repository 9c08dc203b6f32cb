"""Random queries for the builder's fuzz (tests/sdk/test_query_fuzz.py): the table they run
on, and a seeded generator writing them the way a new user and an attacker would."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpnode.sdk import query as dq
from dpnode.sdk.query import col

N = 64
MOCK_ROWS = 20
SUBJECTS = 24
REGIONS = ["north", "south", "east", "west"]
#: the huge integer domain: more keys than any group-by or count_distinct may hold
HUGE = 2**62

#: Columns: name -> (dtype, low, high) as uploaded. ``score``'s bounds are finite on the
#: node, infinite in the handle the queries are built on.
COLUMNS: dict[str, tuple[str, float, float]] = {
    "age": ("int64", 0, 120),
    "visits": ("int32", 0, 12),
    "bmi": ("float32", 10.0, 70.0),
    "income": ("float64", 0.0, 2.0e5),
    "smoker": ("bool", 0, 1),
    "region": ("category", 0, len(REGIONS) - 1),
    "score": ("float64", -50.0, 50.0),
    "big": ("int64", -HUGE, HUGE),
}
UNBOUNDED = "score"


def table(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {"patient": rng.integers(0, SUBJECTS, n)}
    for name, (dt, lo, hi) in COLUMNS.items():
        if dt == "bool":
            out[name] = rng.random(n) < 0.3
        elif dt == "category":
            out[name] = np.array(REGIONS, dtype=object)[rng.integers(0, len(REGIONS), n)]
        elif name == "big":
            out[name] = rng.integers(-(2**40), 2**40, n) * 1000
        elif dt.startswith("int"):
            out[name] = rng.integers(lo, hi + 1, n).astype(dt)
        else:
            out[name] = rng.uniform(lo, hi, n).astype(dt)
    return out


# -- cases: a query as written, and the words a refusal of it must use ---------------------------


@dataclass
class Case:
    """One query: how it was written (for a failure's message), the words that name its
    constructs, what it should release if answered, and the function that publishes it."""

    seed: int
    text: list[str] = field(default_factory=list)
    words: set[str] = field(default_factory=lambda: {"epsilon", "delta"})
    groups: int = 1
    keys: list[str] = field(default_factory=list)
    outputs: list[tuple[str, str, str | None]] = field(default_factory=list)
    top: int | None = None
    epsilon: Any = 1.0
    delta: Any = None
    build: list[Callable[[dq.Query], dq.Query]] = field(default_factory=list)

    def __str__(self) -> str:
        budget = f"epsilon={self.epsilon!r}, delta={self.delta!r}"
        return f"case {self.seed}: ds.query(){''.join(self.text)}.publish({budget})"


def _pick(rng: np.random.Generator, options: list[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _odd(rng: np.random.Generator, usual: list[Any], odd: list[Any], p: float) -> Any:
    """One of ``odd`` with probability ``p``, else one of ``usual``."""
    return _pick(rng, odd if rng.random() < p else usual)


#: the columns a query usually reads, and the ones that should be refused somewhere
USUAL = ["age", "visits", "bmi", "income", "smoker", "region"]
ODD = ["score", "big", "nope"]


def _constant(rng: np.random.Generator, column: str) -> Any:
    """A constant to compare ``column`` with: mostly one of its own kind, else anything."""
    if rng.random() < 0.9:
        dt, lo, hi = COLUMNS.get(column, ("float64", 0.0, 1.0))
        if dt == "category":
            return _pick(rng, REGIONS)
        if dt == "bool":
            return _pick(rng, [True, False, 0, 1])
        if dt.startswith("int"):
            return int(rng.integers(max(lo, -1000), min(hi, 1000) + 1))
        return float(rng.uniform(lo, hi))
    return _pick(
        rng,
        [
            math.nan,
            math.inf,
            -math.inf,
            1e300,
            -1e300,
            10**30,
            -(10**30),
            10**400,
            2**63,
            -7,
            0,
            2.5,
            True,
            "north",
            "nowhere",
            "",
            None,
            np.int64(3),
            np.float32(2.5),
            np.nan,
            [1, 2],
        ],
    )


def _predicate(rng: np.random.Generator, case: Case, depth: int = 0) -> tuple[Any, str]:
    """A random predicate and its text."""
    form = int(rng.integers(7 if depth < 2 else 3))
    if form >= 3:
        left, lt = _predicate(rng, case, depth + 1)
        if form == 3:
            return ~left, f"~({lt})"
        right, rt = _predicate(rng, case, depth + 1)
        if form in (4, 5):
            return left & right, f"({lt}) & ({rt})"
        return left | right, f"({lt}) | ({rt})"
    column = _odd(rng, USUAL, ODD, 0.1)
    case.words.add(column)
    c = col(column)
    if form == 0:
        ordered = COLUMNS.get(column, ("",))[0] != "category"
        op = _odd(rng, [">", ">=", "<", "<="] if ordered else ["==", "!="], ["==", "!=", "<"], 0.2)
        value = _constant(rng, column)
        case.words.add(repr(value))
        fns: dict[str, Callable[[Any], Any]] = {
            ">": c.__gt__,
            ">=": c.__ge__,
            "<": c.__lt__,
            "<=": c.__le__,
            "==": c.__eq__,
            "!=": c.__ne__,
        }
        return fns[op](value), f"col({column!r}) {op} {value!r}"
    if form == 1:
        low, high = _constant(rng, column), _constant(rng, column)
        case.words |= {repr(low), repr(high)}
        return c.between(low, high), f"col({column!r}).between({low!r}, {high!r})"
    values = _odd(
        rng,
        [[_constant(rng, column) for _ in range(k)] for k in (1, 2, 3)],
        [
            [],
            [_constant(rng, column)],
            [_constant(rng, column)] * 2,
            [_constant(rng, column), _constant(rng, column), "nowhere"],
        ],
        0.2,
    )
    case.words |= {repr(v) for v in values}
    return c.isin(values), f"col({column!r}).isin({values!r})"


def groups_of(column: str) -> int:
    """How many public keys a column has (its categories, or its integers)."""
    _, lo, hi = COLUMNS[column]
    return int(hi - lo + 1)


def _group_by(rng: np.random.Generator, case: Case) -> None:
    usual = [str(c) for c in rng.permutation(["region", "smoker", "visits", "age"])]
    by = [_odd(rng, [c], ["bmi", "score", "big", "nope"], 0.1) for c in usual]
    by = by[: int(rng.integers(1, 4))]
    if rng.random() < 0.05:
        by.append(by[0])  # a key twice
    declared: dict[str, list[Any]] = {}
    if rng.random() < 0.2:
        column = _odd(rng, by, ["age"], 0.1)
        declared[column] = _pick(
            rng,
            [
                [],
                [1.0, 2.0],
                [30, 40, 50],
                [30, 30],
                ["north", "east"],
                ["nowhere"],
                [0.5, math.nan],
                [True, False],
                [10**30],
            ],
        )
    case.words |= set(by) | {"group_by", "keys"}
    case.words |= {repr(v) for vs in declared.values() for v in vs}
    case.keys = list(by)
    case.groups = math.prod(
        len(declared[c]) if c in declared else groups_of(c) if c in COLUMNS else 1 for c in by
    )
    keys = declared or None
    case.text.append(
        f".group_by({', '.join(map(repr, by))}" + (f", keys={declared!r})" if declared else ")")
    )
    case.build.append(lambda q: q.group_by(*by, keys=keys))


#: the aggregates by kind, and whether each takes a column
KINDS = ["count", "sum", "mean", "var", "std", "median", "quantile", "min", "max", "count_distinct"]


def _aggregates(rng: np.random.Generator, case: Case) -> None:
    made: list[Callable[[], dq.Aggregate]] = []
    shown: list[str] = []
    for _ in range(int(rng.integers(1, 5))):
        kind = _pick(rng, KINDS)
        case.words.add(kind)
        column: Any = None
        if kind == "count":
            make: Callable[[], dq.Aggregate] = dq.count
            text = "count()"
        else:
            if kind == "count_distinct":  # mostly of a column with public keys
                column = _odd(rng, ["region", "smoker", "visits"], USUAL, 0.2)
            else:
                column = _odd(rng, [*USUAL[:5], col("age")], [*ODD, "region", 3], 0.1)
            name = column.name if isinstance(column, dq.Column) else column
            case.words |= {str(name), repr(name)}
            if kind == "quantile":
                q = _odd(rng, [0.1, 0.5, 0.9, 0.0, 1.0, 0.25], [-0.5, 1.5, math.nan, math.inf], 0.1)
                case.words |= {"q", repr(q)}
                make = lambda c=column, q=q: dq.quantile(c, q)  # noqa: E731
                text = f"quantile({column!r}, {q!r})"
            else:
                fn = getattr(dq, kind)
                make = lambda fn=fn, c=column: fn(c)  # noqa: E731
                text = f"{kind}({column!r})"
            column = name
        alias = None
        if rng.random() < 0.15:
            alias = _odd(rng, [f"s{len(made)}"], ["x", "count", "age", "", 5], 0.3)
            case.words |= {"alias", repr(alias)}
            text += f".alias({alias!r})"
            make = lambda m=make, a=alias: m().alias(a)  # noqa: E731
        made.append(make)
        shown.append(text)
        case.outputs.append((kind, str(alias) if alias is not None else "", column))
    case.words.add("named")
    case.text.append(f".agg({', '.join(shown)})")
    case.build.append(lambda q: q.agg(*(m() for m in made)))


def draw(seed: int) -> Case:
    rng = np.random.default_rng([seed, 11])
    case = Case(seed)
    for _ in range(int(rng.integers(0, 3))):
        predicate, text = _predicate(rng, case)
        case.text.append(f".filter({text})")
        case.build.append(lambda q, p=predicate: q.filter(p))
    if rng.random() < 0.6:
        _group_by(rng, case)
    if rng.random() < 0.97:
        _aggregates(rng, case)
    else:
        case.words |= {"agg"}
    if rng.random() < 0.1:
        k = _odd(rng, [1, 3, 100], [0, -1, 2.5, True], 0.3)
        case.top = k
        case.words |= {"top_k", repr(k)}
        case.text.append(f".top_k({k!r})")
        case.build.append(lambda q: q.top_k(k))
    odd = [0, 0.0, -1.0, math.nan, math.inf, 1e300, 1e-300, None, "1"]
    case.epsilon = _odd(rng, [0.5, 1.0, 2.0, 3.7], odd, 0.08)
    if rng.random() < 0.3:
        case.delta = _odd(
            rng, [1e-6, 1e-9], [0.0, 1.0, 1.5, -1e-6, math.nan, math.inf, 1e-300], 0.2
        )
    return case
