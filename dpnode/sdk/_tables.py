"""Turn what owners hold — DataFrames, dicts of columns, arrays, torch tensors — into columns.

Arrow-like tables (Polars, pyarrow, Parquet/Arrow/CSV files) go through
:mod:`dpnode.core.ingest`, which keeps their column names and dtypes.

Numeric columns become NumPy arrays sent as raw bytes; string columns become
lists of strings (``None`` for missing), which the node encodes against the
declared categories. No validation happens here: the node is the authority.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.ingest import arrow_columns, is_arrow_like

Columns = dict[str, "npt.NDArray[Any] | list[str | None]"]


def to_numpy(value: Any, what: str) -> npt.NDArray[Any]:
    """A NumPy view of ``value`` (torch tensors included, without importing torch)."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch.Tensor
        value = value.detach()
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":
            raise TypeError(f"{what} is bfloat16, which cannot travel as NumPy; cast it first")
        if getattr(value, "is_meta", False) or type(value).__name__ == "RemoteTensor":
            raise TypeError(f"{what} holds no local values to upload")
        value = value.cpu().numpy()
    return np.asarray(value)


def _is_frame(data: Any) -> bool:
    return hasattr(data, "columns") and hasattr(data, "dtypes") and hasattr(data, "iloc")


def _strings(values: npt.NDArray[Any]) -> list[str | None]:
    out: list[str | None] = []
    for v in values.tolist():
        if v is None or (isinstance(v, float) and v != v):  # None or NaN: missing
            out.append(None)
        else:
            out.append(str(v))
    return out


def _column(name: str, values: Any) -> npt.NDArray[Any] | list[str | None]:
    array = to_numpy(values, f"column {name!r}")
    if array.dtype.kind in "OUS":
        if array.ndim != 1:
            raise TypeError(f"string column {name!r} must be one-dimensional")
        return _strings(array)
    return array


def columns_of(data: Any, names: Sequence[str] | None = None) -> Columns:
    """Columns of a DataFrame, a mapping, a structured array or a 2-D array.

    >>> sorted(columns_of({"a": [1, 2], "b": ["x", "y"]}).items())[1]
    ('b', ['x', 'y'])
    >>> list(columns_of(np.zeros((3, 2)), names=["u", "v"]))
    ['u', 'v']
    """
    if data is None:
        raise TypeError("no data given")
    if is_arrow_like(data):  # Polars, pyarrow, a file: through Arrow, names and dtypes kept
        return arrow_columns(data)
    if _is_frame(data):
        return {str(c): _column(str(c), _frame_column(data[c])) for c in data.columns}
    if isinstance(data, Mapping):
        return {str(k): _column(str(k), v) for k, v in data.items()}
    array = to_numpy(data, "data")
    if array.dtype.names:
        return {n: _column(n, array[n]) for n in array.dtype.names}
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise TypeError(
            f"an array of shape {array.shape} is ambiguous: pass a dict of columns instead"
        )
    if names is None:
        names = [f"x{i}" for i in range(array.shape[1])]
    if len(names) != array.shape[1]:
        raise TypeError(f"{len(names)} column names for {array.shape[1]} columns")
    return {str(n): _column(str(n), array[:, i]) for i, n in enumerate(names)}


def _frame_column(series: Any) -> Any:
    kind = str(series.dtype)
    if kind in ("category", "object", "string", "str") or kind.startswith("string"):
        return np.asarray(series.astype(object), dtype=object)
    if kind == "boolean":
        if series.isna().any():
            raise TypeError(f"boolean column {series.name!r} has missing values")
        return series.to_numpy(dtype=bool)
    if kind.startswith(("Int", "UInt", "Float")):  # pandas' nullable numbers: missing -> NaN
        return series.to_numpy(dtype="float64", na_value=np.nan)
    return series.to_numpy()
