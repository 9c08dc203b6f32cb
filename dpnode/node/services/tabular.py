"""The upload contract: turn an owner's columns into bounded, encoded, storable arrays.

This is where the privacy contract starts. Every numeric column declares public
bounds; values outside them are refused (or clamped when the owner asks), NaN and
infinities are refused (or filled), and string columns are encoded as indices
into a declared public category list. Everything downstream — sensitivity, noise —
trusts these bounds, so nothing here is lenient. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.subnormals import flush
from dpnode.core.errors import UploadRejectedError

#: dtypes a column or a weight tensor may have (by NumPy name).
STORABLE_DTYPES = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
)
MAX_NAME_LENGTH = 200
MAX_CATEGORIES = 100_000


@dataclass(frozen=True)
class ColumnSpec:
    """What the owner declared about the columns, all of it public."""

    bounds: Mapping[str, tuple[float, float]]
    categories: Mapping[str, Sequence[str]]
    clamp: bool | frozenset[str] = False
    fill: Mapping[str, float] | None = None
    subject_id: str | None = None

    def clamps(self, column: str) -> bool:
        return self.clamp is True or (isinstance(self.clamp, frozenset) and column in self.clamp)


@dataclass(frozen=True)
class PreparedColumn:
    name: str
    values: npt.NDArray[Any]
    lower: float
    upper: float
    categories: list[str] | None

    @property
    def row_shape(self) -> list[int]:
        return list(self.values.shape[1:])


@dataclass(frozen=True)
class PreparedTable:
    columns: list[PreparedColumn]
    row_count: int
    #: int64 subject index per row, or None when every row is its own subject.
    subjects: npt.NDArray[np.int64] | None
    subject_count: int
    max_rows_per_subject: int


def check_name(kind: str, name: str) -> str:
    """A column, tensor or dataset name: non-empty, printable, at most 200 characters.

    >>> check_name("column", "age")
    'age'
    """
    if not isinstance(name, str) or not name.strip():
        raise UploadRejectedError(f"{kind} names must be non-empty strings, got {name!r}")
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise UploadRejectedError(
            f"{kind} name {name[:40]!r} must be printable and at most {MAX_NAME_LENGTH} characters"
        )
    return name


def check_array(kind: str, name: str, array: npt.NDArray[Any], max_elements: int) -> None:
    """Refuse arrays whose dtype cannot be stored or whose size is over the limit."""
    if array.dtype.name not in STORABLE_DTYPES:
        allowed = ", ".join(sorted(STORABLE_DTYPES))
        raise UploadRejectedError(
            f"{kind} {name!r} has dtype {array.dtype.name}, which dpnode does not store; "
            f"use one of: {allowed} (strings: declare categories)"
        )
    if array.size > max_elements:
        raise UploadRejectedError(
            f"{kind} {name!r} has {array.size} elements, over the limit of {max_elements}"
        )


def check_bounds(column: str, bounds: Any) -> tuple[float, float]:
    try:
        lower, upper = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise UploadRejectedError(
            f"bounds of column {column!r} must be a pair (low, high), got {bounds!r}"
        ) from None
    if not (math.isfinite(lower) and math.isfinite(upper)) or lower > upper:
        raise UploadRejectedError(
            f"bounds of column {column!r} must be finite with low <= high, got ({lower}, {upper})"
        )
    return lower, upper


def _outside_subnormals(dtype: np.dtype[Any], lower: float, upper: float) -> tuple[float, float]:
    """Bounds moved outward off the dtype's subnormal range: to 0 or to its smallest normal.

    Values are stored with subnormals as 0 (:mod:`dpnode.core.engine.subnormals`); one
    clamped to a subnormal bound stayed subnormal, and its time could be counted.

    >>> _outside_subnormals(np.dtype("float64"), 1e-310, 1e-310)
    (0.0, 2.2250738585072014e-308)
    """
    tiny = float(np.finfo(dtype).tiny)
    if abs(lower) < tiny:
        lower = -tiny if lower < 0 else 0.0
    if abs(upper) < tiny:
        upper = tiny if upper > 0 else 0.0
    return lower, upper


def _within_dtype(
    column: str, dtype: np.dtype[Any], lower: float, upper: float
) -> tuple[float, float]:
    """Tighten bounds to the finite values ``dtype`` can hold; refuse bounds it cannot meet.

    Stored values can never leave their dtype's range, so this keeps the bounds sound, and
    it keeps them finite (``float16`` cannot hold 1e6) and castable when clamping.

    >>> _within_dtype("x", np.dtype("int8"), -1000.0, 50.0)
    (-128.0, 50.0)
    """
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    low, high = float(info.min), float(info.max)
    if lower > high or upper < low:
        raise UploadRejectedError(
            f"bounds [{lower:g}, {upper:g}] of column {column!r} hold no value its dtype "
            f"{dtype.name} can store"
        )
    return max(lower, low), min(upper, high)


def _representable(dtype: np.dtype[Any], lower: float, upper: float) -> tuple[float, float]:
    """Widen bounds to the nearest values ``dtype`` can hold, so stored values respect them.

    >>> _representable(np.dtype("float32"), 0.0, 0.1)[1] >= 0.1
    True
    """
    lo, hi = dtype.type(lower), dtype.type(upper)
    if float(lo) > lower:
        lo = np.nextafter(lo, dtype.type(-np.inf))
    if float(hi) < upper:
        hi = np.nextafter(hi, dtype.type(np.inf))
    return float(lo), float(hi)


def _encode_strings(column: str, values: Sequence[Any], categories: Sequence[str]) -> Any:
    index = {c: i for i, c in enumerate(categories)}
    codes = np.fromiter((index.get(v, -1) for v in values), dtype=np.int64, count=len(values))
    unknown = codes < 0
    if unknown.any():
        seen = sorted({str(v) for v in np.asarray(values, dtype=object)[unknown][:1000]})[:5]
        raise UploadRejectedError(
            f"column {column!r} has {int(unknown.sum())} values that are not among its declared "
            f"categories {list(categories)[:10]} (for example {seen}); add them to the "
            "categories or clean the data"
        )
    return codes


@dataclass(frozen=True)
class NumericContract:
    """What a numeric column's declarations and dtype make of its bounds (public only)."""

    lower: float
    upper: float
    categories: list[str] | None
    #: Bounds as declared (within the dtype), before widening to representable values:
    #: what a fill value must lie in.
    fill_lower: float
    fill_upper: float


def numeric_contract(
    column: str, dtype: np.dtype[Any], spec: ColumnSpec, what: str = ""
) -> NumericContract:
    """The bounds every value of a numeric ``column`` of ``dtype`` will be held to.

    Decided from the declarations and the dtype alone, so a column streamed in blocks
    is held to the same bounds as one sent whole.

    >>> c = numeric_contract("n", np.dtype("int16"), ColumnSpec({"n": (0.5, 9.5)}, {}))
    >>> c.lower, c.upper
    (1.0, 9.0)
    """
    categories = spec.categories.get(column)
    if dtype.name not in STORABLE_DTYPES:
        check_array("column", column, np.empty(0, dtype), 0)
    if categories is not None and len(categories) > MAX_CATEGORIES:
        # every listing of the catalog carries them: 2 million made each one 20 MB
        raise UploadRejectedError(
            f"column {column!r} declares {len(categories)} categories; at most "
            f"{MAX_CATEGORIES} are allowed"
        )
    if categories is not None:
        lower, upper = 0.0, len(categories) - 1.0
    elif dtype.kind == "b":
        lower, upper = 0.0, 1.0
    elif column in spec.bounds:
        lower, upper = check_bounds(column, spec.bounds[column])
        if dtype.kind in "iuf":
            lower, upper = _within_dtype(column, dtype, lower, upper)
    else:
        raise UploadRejectedError(
            f"column {column!r} has no declared bounds; pass bounds={{{column!r}: (low, high)}}: "
            "bounds are the public privacy contract every result's noise is calibrated to"
        )
    fill_lower, fill_upper = lower, upper
    stored = np.dtype(np.int64) if categories is not None and dtype.kind == "f" else dtype
    if stored.kind == "f":
        lower, upper = _outside_subnormals(stored, *_representable(stored, lower, upper))
    if stored.kind in "iu":
        # Integer columns can only hold whole numbers: tighten the bounds to them.
        lower, upper = float(math.ceil(lower)), float(math.floor(upper))
        if lower > upper:
            raise UploadRejectedError(f"bounds of integer column {column!r} contain no integer")
    return NumericContract(
        lower, upper, list(categories) if categories is not None else None, fill_lower, fill_upper
    )


@dataclass
class Violations:
    """Counts of values a column's contract refuses, summed over its blocks."""

    non_finite: int = 0
    outside: int = 0

    def check(self, column: str, contract: NumericContract, what: str = "") -> None:
        """Raise for the values counted, with the column's totals in the message."""
        if self.non_finite:
            raise UploadRejectedError(
                f"{what}column {column!r} has {self.non_finite} NaN or infinite values; pass "
                f"fill={{{column!r}: value}} to replace them, or clean the data"
            )
        if self.outside:
            raise UploadRejectedError(
                f"{what}column {column!r} has {self.outside} values outside its declared bounds "
                f"[{contract.lower:g}, {contract.upper:g}]; fix the bounds, or pass clamp=True "
                "to clip them"
            )


def encode_block(
    column: str,
    values: npt.NDArray[Any],
    contract: NumericContract,
    spec: ColumnSpec,
    violations: Violations,
    what: str = "",
) -> npt.NDArray[Any]:
    """Hold one block of a numeric column to its contract: fill, clamp, or count refusals.

    Elementwise, so encoding a column block by block gives the bytes of encoding it
    whole. Refused values are counted in ``violations`` (the caller raises once the whole
    column is counted, see :meth:`Violations.check`); the block is returned as stored.
    """
    categories = contract.categories
    lower, upper = contract.lower, contract.upper
    if categories is not None and values.dtype.kind == "f":
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
            raise UploadRejectedError(
                f"{what}categorical column {column!r} must hold whole category indices"
            )
        values = values.astype(np.int64)
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        n_bad = int(bad.sum())
        if n_bad:
            fill = (spec.fill or {}).get(column)
            if fill is None:
                violations.non_finite += n_bad
            elif not contract.fill_lower <= fill <= contract.fill_upper:
                raise UploadRejectedError(
                    f"fill value {fill} for column {column!r} lies outside its bounds "
                    f"[{contract.fill_lower:g}, {contract.fill_upper:g}]"
                )
            else:
                values = np.where(bad, np.asarray(fill, dtype=values.dtype), values)
        # subnormal values are stored as zeros: the engine's arithmetic never meets one, so
        # a publish's time cannot count them (dpnode.core.engine.subnormals)
        values = flush(values)
        # -0.0 + 0.0 is +0.0: a zero's sign is a bit the bounds do not speak of, and an
        # output such as x * 0.0 (sensitivity 0, so released as computed) would carry it
        values = values + values.dtype.type(0.0)
    outside = (values < lower) | (values > upper)
    n_out = int(outside.sum())
    if n_out:
        if not spec.clamps(column) or categories is not None:
            violations.outside += n_out
            return values
        low: float | int = lower
        high: float | int = upper
        if values.dtype.kind in "iu":
            # float(int64 max) is 2**63, one past what int64 holds: clip with exact integers.
            info = np.iinfo(values.dtype)
            low, high = max(int(lower), int(info.min)), min(int(upper), int(info.max))
        values = np.clip(values, values.dtype.type(low), values.dtype.type(high))
    return values


def _numeric(
    column: str, raw: npt.NDArray[Any], spec: ColumnSpec, what: str
) -> tuple[npt.NDArray[Any], float, float, list[str] | None]:
    categories = spec.categories.get(column)
    if raw.dtype.kind in "OUS":
        if categories is None:
            raise UploadRejectedError(
                f"{what}column {column!r} holds strings; declare its public category list, "
                f"e.g. categories={{{column!r}: ['a', 'b']}}, so it can be encoded"
            )
        return (
            _encode_strings(column, raw.tolist(), categories),
            0.0,
            len(categories) - 1.0,
            list(categories),
        )
    contract = numeric_contract(column, raw.dtype, spec, what)
    violations = Violations()
    values = encode_block(column, raw, contract, spec, violations, what)
    violations.check(column, contract, what)
    return values, contract.lower, contract.upper, contract.categories


def subject_index(column: str, raw: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], int, int]:
    if raw.ndim != 1:
        raise UploadRejectedError(f"subject id column {column!r} must be one value per row")
    if raw.dtype.kind == "f" and not np.all(np.isfinite(raw)):
        raise UploadRejectedError(f"subject id column {column!r} has NaN or infinite ids")
    keys = raw.astype(str) if raw.dtype.kind == "O" else raw
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return inverse.astype(np.int64), len(counts), int(counts.max())


def check_declarations(
    names: Sequence[str], present: Sequence[str], spec: ColumnSpec, what: str = ""
) -> None:
    """The column order matches the columns sent, and every declaration names one of them.

    >>> check_declarations(["a"], ["a"], ColumnSpec({"b": (0, 1)}, {}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpnode.core.errors.UploadRejectedError: bounds declared for column 'b', but the data has no ...
    """
    columns = set(present)
    if not names:
        raise UploadRejectedError("a dataset needs at least one column")
    if len(set(names)) != len(names) or set(names) != columns:
        raise UploadRejectedError(
            f"column order {names[:10]} does not match the columns sent {list(present)[:10]}"
        )
    clamped = spec.clamp if isinstance(spec.clamp, frozenset) else frozenset()
    declarations = {
        "bounds": spec.bounds,
        "categories": spec.categories,
        "fill": spec.fill or {},
        "clamp": sorted(clamped),
    }
    for kind, declared in declarations.items():
        for column in declared:
            if column not in columns:
                raise UploadRejectedError(
                    f"{kind} declared for column {column!r}, but the {what}data has no such column"
                )
    if spec.subject_id is not None and spec.subject_id not in columns:
        raise UploadRejectedError(f"{what}data has no subject id column {spec.subject_id!r}")


def check_undeclared(dtypes: Mapping[str, np.dtype[Any]], spec: ColumnSpec, what: str = "") -> None:
    """Every column but the subject id has its contract declared: bounds for numbers, a
    category list for strings. All that lack one are named in one refusal, so an upload is
    not sent again once per forgotten column.

    >>> i = np.dtype("int64")
    >>> try:
    ...     check_undeclared({"a": i, "b": i, "c": np.dtype("O")}, ColumnSpec({}, {}))
    ... except UploadRejectedError as exc:
    ...     print(str(exc).split("; ")[0], "| strings too:", "column 'c' holds strings" in str(exc))
    columns 'a', 'b' have no declared bounds | strings too: True
    """
    declared = {*spec.bounds, *spec.categories, spec.subject_id}
    strings = [c for c, d in dtypes.items() if d.kind in "OUS" and c not in declared]
    numbers = [c for c, d in dtypes.items() if d.kind in "iuf" and c not in declared]
    problems = []
    if numbers:
        named = ", ".join(repr(c) for c in numbers)
        wanted = ", ".join(f"{c!r}: (low, high)" for c in numbers)
        have = "has" if len(numbers) == 1 else "have"
        problems.append(
            f"{what}column{'s' * (len(numbers) > 1)} {named} {have} no declared bounds; "
            f"pass bounds={{{wanted}}}"
        )
    if strings:
        named = ", ".join(repr(c) for c in strings)
        wanted = ", ".join(f"{c!r}: ['a', 'b']" for c in strings)
        hold = "holds" if len(strings) == 1 else "hold"
        its = "its" if len(strings) == 1 else "their"
        problems.append(
            f"{what}column{'s' * (len(strings) > 1)} {named} {hold} strings: declare {its} "
            f"public category list, e.g. categories={{{wanted}}}"
        )
    if problems:
        raise UploadRejectedError(
            "; and ".join(problems) + ". The declarations are the public privacy contract "
            "every result's noise is calibrated to"
        )


def prepare_table(
    columns: Mapping[str, npt.NDArray[Any]],
    spec: ColumnSpec,
    *,
    order: Sequence[str] | None = None,
    max_elements: int,
    what: str = "",
) -> PreparedTable:
    """Validate and encode one table (real or mock data) against the declared contract.

    Args:
        columns: column name -> array whose first axis is the row (strings as object arrays).
        spec: the owner's declarations.
        order: the column order to keep (defaults to ``columns``' order).
        max_elements: the largest column allowed.
        what: a prefix for messages, e.g. ``"mock "``.

    Raises:
        UploadRejectedError: with a message naming the column and what is wrong.
    """
    names = list(order) if order is not None else list(columns)
    check_declarations(names, list(columns), spec, what)
    check_undeclared({name: columns[name].dtype for name in names}, spec, what)
    row_counts = {name: (columns[name].shape[0] if columns[name].ndim else 0) for name in names}
    n = row_counts[names[0]]
    if n == 0 or len(set(row_counts.values())) != 1:
        raise UploadRejectedError(
            f"{what}columns must all have the same, non-zero number of rows; got "
            f"{dict(list(row_counts.items())[:10])}"
        )
    prepared: list[PreparedColumn] = []
    subjects: npt.NDArray[np.int64] | None = None
    subject_count, max_rows = n, 1
    for name in names:
        check_name("column", name)
        raw = columns[name]
        if raw.size > max_elements:
            raise UploadRejectedError(
                f"column {name!r} has {raw.size} elements, over the limit of {max_elements}"
            )
        if name == spec.subject_id:
            subjects, subject_count, max_rows = subject_index(name, raw)
            continue
        values, lower, upper, categories = _numeric(name, raw, spec, what)
        prepared.append(
            PreparedColumn(name, np.ascontiguousarray(values), lower, upper, categories)
        )
    if not prepared:
        raise UploadRejectedError("a dataset needs at least one column besides the subject id")
    return PreparedTable(prepared, n, subjects, subject_count, max_rows)
