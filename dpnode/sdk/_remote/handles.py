"""Remote tensors for dataset columns and model weights (the bodies of the handle methods)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk._remote import remote_input
from dpnode.sdk._remote.graph import TORCH_OF
from dpnode.sdk._remote.mock import active_session
from dpnode.sdk._remote.tensor import RemoteTensor
from dpnode.sdk._synthetic_publish import remember

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo, DatasetHandle, ModelHandle

__all__ = [
    "column_info",
    "column_tensor",
    "dataset_tensors",
    "model_state",
    "subjects_tensor",
]


def column_info(ds: DatasetHandle, column: str) -> ColumnInfo:
    """The column's public facts.

    Raises:
        KeyError: no such column (the message lists the columns).
    """
    info = ds.columns.get(column)
    if info is None:
        raise KeyError(
            f"dataset {ds.name!r} has no column {column!r}; its columns are {sorted(ds.columns)}"
        )
    return info


def _rows(ds: DatasetHandle, column: str | None) -> int:
    """The dataset's rows: the mock data's inside ``sdk.mock(ds)``."""
    session = active_session()
    if session is None or not session.covers(ds):
        return ds.row_count
    if column is None:  # the mock data's first column, as the mock release binds it
        column = next(iter(session._frame(ds)), None)
        if column is None:
            return 0
    return int(session.column(ds, column).shape[0])


def column_tensor(ds: DatasetHandle, column: str) -> RemoteTensor:
    """``ds[column]``."""
    info = column_info(ds, column)
    rows = _rows(ds, column)
    remember(ds)
    dtype = TORCH_OF[info.dtype]
    return remote_input(
        f"dataset:{ds.id}/{column}",
        (rows, *info.shape),
        dtype,
        f"dataset {ds.name!r}[{column!r}]",
        origin=ds._client,
    )


def subjects_tensor(ds: DatasetHandle) -> RemoteTensor:
    """``ds.subjects``: shaped like the mock data inside ``sdk.mock(ds)``, whose rows stand
    for a subject each (unless the mock data carries the subject column)."""
    remember(ds)
    return remote_input(
        f"dataset:{ds.id}/@subject", (_rows(ds, None),), torch.int64, origin=ds._client
    )


def _matrix(ds: DatasetHandle, names: Sequence[str]) -> torch.Tensor:
    cols = [column_tensor(ds, n) for n in names]
    dtype = cols[0].dtype
    for c in cols[1:]:
        dtype = torch.promote_types(dtype, c.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    flat = [c.to(dtype).reshape(c.shape[0], -1) for c in cols]
    out = torch.cat(flat, dim=1)
    if isinstance(out, RemoteTensor):
        out._source = f"dataset {ds.name!r}{list(names)}"
    return out


def dataset_tensors(
    ds: DatasetHandle, columns: Sequence[str | list[str]], stack: bool | None
) -> Any:
    """``ds.tensors(*columns, stack=...)``."""
    if not columns:
        raise ValueError("name at least one column")
    if any(isinstance(c, (list, tuple)) for c in columns):
        grouped = tuple(
            _matrix(ds, list(c)) if isinstance(c, (list, tuple)) else column_tensor(ds, c)
            for c in columns
        )
        return grouped[0] if len(grouped) == 1 else grouped  # one list: its matrix
    names = [str(c) for c in columns]
    if stack is None:
        stack = all(ds.columns[n].shape == () for n in names if n in ds.columns)
    if stack:
        return _matrix(ds, names)
    tensors = tuple(column_tensor(ds, n) for n in names)
    return tensors[0] if len(tensors) == 1 else tensors


def model_state(model: ModelHandle) -> dict[str, RemoteTensor]:
    """``model.state_dict()``."""
    session = active_session()
    mocked = session is not None and session.covers(model)
    out: dict[str, RemoteTensor] = {}
    for name, info in model.tensors.items():
        shape = tuple(info.shape)
        if mocked:
            assert session is not None
            shape = tuple(session._frame(model)[name].shape)
        out[name] = remote_input(
            f"model:{model.id}/{name}",
            shape,
            TORCH_OF[info.dtype],
            f"model {model.name!r}[{name!r}]",
            origin=model._client,
        )
    return out
