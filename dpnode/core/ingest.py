"""Tables as streams of row blocks: what a chunked upload sends (see ``docs/datasets.md``).

Used by the SDK (on the owner's machine) and by ``dpnode dataset add``; it imports
pyarrow only when given Arrow data, and never torch.

A :class:`TableSource` knows a table's columns (name, dtype, row shape) and row count,
and yields it in blocks of rows as NumPy arrays. Sources are in-memory columns (NumPy,
pandas, torch) or anything Arrow: a ``pyarrow.Table``, a ``RecordBatchReader``, a Polars
frame (through Arrow, keeping names and dtypes), or a Parquet, Arrow IPC or CSV file,
read batch by batch. A reader or a CSV file, whose row count is unknown until read, is
first spooled once to a local Arrow IPC file (memory-mapped, so never in memory whole).

String columns travel as int64 indices into their declared public categories, and a
string subject id column as int64 codes (equal ids, equal codes): the node holds each to
its contract exactly as it would the strings. An integer column with missing values
travels as float64 with NaN for them (as pandas' nullable integers do), which the node
then refuses or fills (``fill=``) like any NaN.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.errors import UploadRejectedError

#: File suffixes read as Arrow IPC files (Feather v2 is Arrow IPC).
_IPC_SUFFIXES = (".arrow", ".feather", ".ipc")
_BLOCK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.row_shape)


@dataclass
class TableSource:
    """A table's layout and a way to read it in blocks of ``block_rows`` rows."""

    columns: list[ColumnInfo]
    rows: int
    read: Callable[[int], Iterator[dict[str, npt.NDArray[Any]]]]
    cleanup: Callable[[], None] | None = None

    @property
    def row_bytes(self) -> int:
        return sum(c.row_bytes for c in self.columns)

    def block_rows(self) -> int:
        return max(1, min(self.rows, _BLOCK_BYTES // max(1, self.row_bytes)))

    def stream(self, block_rows: int) -> Iterator[bytes]:
        """The table's bytes: for each block of rows, every column's bytes for it."""
        for block in self.read(block_rows):
            for column in self.columns:
                values = np.ascontiguousarray(block[column.name], dtype=column.dtype)
                yield values.tobytes()


class _Codes:
    """Strings to int64 codes: declared categories, or first-seen order (subject ids)."""

    def __init__(self, name: str, categories: Sequence[str] | None) -> None:
        self.name = name
        self.categories = list(categories) if categories is not None else None
        self.index: dict[Any, int] = (
            {c: i for i, c in enumerate(categories)} if categories is not None else {}
        )

    def __call__(self, values: Sequence[Any]) -> npt.NDArray[np.int64]:
        if self.categories is None:  # subject ids: any value, equal values equal codes
            index = self.index
            return np.fromiter(
                (index.setdefault(v, len(index)) for v in values), np.int64, len(values)
            )
        codes = np.fromiter((self.index.get(v, -1) for v in values), np.int64, len(values))
        unknown = codes < 0
        if unknown.any():
            seen = sorted({str(v) for v, u in zip(values, unknown, strict=True) if u})[:5]
            raise UploadRejectedError(
                f"column {self.name!r} has {int(unknown.sum())} values that are not among its "
                f"declared categories {self.categories[:10]} (for example {seen}); add them "
                "to the categories or clean the data"
            )
        return codes


def _coder(name: str, categories: Mapping[str, Sequence[str]], subject_id: str | None) -> _Codes:
    if name in categories:
        return _Codes(name, categories[name])
    if name == subject_id:
        return _Codes(name, None)
    raise UploadRejectedError(
        f"column {name!r} holds strings; declare its public category list, "
        f"e.g. categories={{{name!r}: ['a', 'b']}}, so it can be encoded"
    )


# -- in-memory columns ------------------------------------------------------------------------


def memory_source(
    columns: Mapping[str, npt.NDArray[Any] | list[str | None]],
    categories: Mapping[str, Sequence[str]],
    subject_id: str | None,
) -> TableSource:
    """Columns already in memory (string columns as lists), encoded for the stream."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, values in columns.items():
        if isinstance(values, list):
            arrays[name] = _coder(name, categories, subject_id)(values)
        else:
            arrays[name] = values
    rows = {len(v) if np.ndim(v) else 0 for v in arrays.values()}
    if len(rows) != 1 or 0 in rows:
        raise UploadRejectedError(
            "columns must all have the same, non-zero number of rows; got "
            f"{ {k: (len(v) if np.ndim(v) else 0) for k, v in list(arrays.items())[:10]} }"
        )
    (n,) = rows
    info = [ColumnInfo(k, v.dtype, tuple(v.shape[1:])) for k, v in arrays.items()]

    def read(block_rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
        for start in range(0, n, block_rows):
            yield {k: v[start : start + block_rows] for k, v in arrays.items()}

    return TableSource(info, n, read)


# -- Arrow ----------------------------------------------------------------------------------


def is_arrow_like(data: Any) -> bool:
    """Polars frames, pyarrow tables and readers, and files of a known suffix."""
    if isinstance(data, str | Path):
        return True
    module = type(data).__module__.split(".")[0]
    return module in ("pyarrow", "polars")


def _numpy_type(name: str, arrow_type: Any, nulls: bool = False) -> np.dtype[Any] | None:
    """The NumPy dtype a numeric Arrow column travels as; None for strings.

    >>> import pyarrow as pa
    >>> _numpy_type("n", pa.int32()), _numpy_type("n", pa.int32(), nulls=True)
    (dtype('int32'), dtype('float64'))
    """
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return None
    if pa.types.is_boolean(t):
        return np.dtype(bool)
    if pa.types.is_integer(t) and nulls:
        return np.dtype(np.float64)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        dtype: np.dtype[Any] = np.dtype(t.to_pandas_dtype())
        return dtype
    raise UploadRejectedError(
        f"column {name!r} has Arrow type {arrow_type}, which dpnode does not store: cast it to "
        "a number, a boolean or a string (with declared categories)"
    )


def _to_numpy(name: str, array: Any, dtype: np.dtype[Any] | None, coder: _Codes | None) -> Any:
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if dtype is None:
        assert coder is not None
        return coder(array.to_pylist())
    if array.null_count:
        if dtype.kind != "f":  # a Parquet file whose statistics did not count its nulls
            raise UploadRejectedError(
                f"column {name!r} ({dtype.name}) has {array.null_count} missing values, which "
                "only a float column can hold (as NaN, then filled with fill=...): cast or "
                "fill it first"
            )
        return array.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(dtype)
    return array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _rebatch(batches: Iterator[Any], block_rows: int) -> Iterator[Any]:
    """Record batches of exactly ``block_rows`` rows (the last one shorter)."""
    import pyarrow as pa

    pending: list[Any] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += batch.num_rows
        while held >= block_rows:
            table = pa.Table.from_batches(pending)
            yield table.slice(0, block_rows)
            rest = table.slice(block_rows)
            pending, held = rest.to_batches(), rest.num_rows
    if held:
        yield pa.Table.from_batches(pending)


def arrow_source(
    data: Any,
    categories: Mapping[str, Sequence[str]],
    subject_id: str | None,
    *,
    csv_options: Mapping[str, Any] | None = None,
) -> TableSource:
    """A table from anything Arrow reads: a path (``.parquet``, ``.arrow``/``.feather``,
    ``.csv``), a ``pyarrow.Table`` or ``RecordBatchReader``, or a Polars frame."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    cleanup: Callable[[], None] | None = None
    if type(data).__module__.split(".")[0] == "polars":
        if hasattr(data, "collect"):  # a LazyFrame
            data = data.collect()
        data = data.to_arrow()
    if isinstance(data, str | Path):
        path = Path(data)
        suffix = path.suffix.lower()
        if suffix in (".parquet", ".pq"):
            parquet = pq.ParquetFile(path)  # read by row groups, never whole
            schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
            nulls = _parquet_nulls(parquet)

            def batches(block_rows: int) -> Iterator[Any]:
                return iter(parquet.iter_batches(batch_size=block_rows))

            return _arrow_table_source(schema, rows, batches, categories, subject_id, None, nulls)
        data = _open_path(path, _csv_options(csv_options, categories, subject_id), whole=False)
    if isinstance(data, pa.RecordBatchReader):
        # Row count unknown until read: spool the stream once to a memory-mapped file.
        spool = tempfile.NamedTemporaryFile(suffix=".arrow", delete=False)  # noqa: SIM115
        spool.close()
        cleanup = lambda: Path(spool.name).unlink(missing_ok=True)  # noqa: E731
        try:
            with pa.OSFile(spool.name, "wb") as sink, ipc.new_file(sink, data.schema) as writer:
                for batch in data:
                    writer.write_batch(batch)
            data = ipc.open_file(pa.memory_map(spool.name)).read_all()
        except BaseException:  # a malformed line deep in a CSV file, say
            cleanup()
            raise
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        data = pa.table(data)  # anything with the Arrow PyCapsule interface
    table = data

    def table_batches(block_rows: int) -> Iterator[Any]:
        return iter(table.to_batches(max_chunksize=block_rows))

    nulls = {str(n): table.column(n).null_count > 0 for n in table.column_names}
    return _arrow_table_source(
        table.schema, table.num_rows, table_batches, categories, subject_id, cleanup, nulls
    )


def _parquet_nulls(parquet: Any) -> dict[str, bool]:
    """Which columns of a Parquet file hold nulls, from its row groups' statistics."""
    meta = parquet.metadata
    out: dict[str, bool] = {}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            stats = column.statistics
            name = column.path_in_schema
            if stats is not None and stats.has_null_count:
                out[name] = out.get(name, False) or stats.null_count > 0
    return out


def _csv_options(
    options: Mapping[str, Any] | None,
    categories: Mapping[str, Sequence[str]],
    subject_id: str | None,
) -> dict[str, Any]:
    """CSV reading options: declared category and subject id columns are read as strings
    (so that categories such as "1", "2" are not taken for numbers)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    merged = dict(options or {})
    strings = set(categories) | ({subject_id} if subject_id else set())
    if strings and "convert_options" not in merged:
        merged["convert_options"] = pacsv.ConvertOptions(
            column_types={name: pa.string() for name in strings}
        )
    return merged


def _open_path(path: Path, csv_options: Mapping[str, Any] | None, *, whole: bool) -> Any:
    """A table (memory-mapped for Arrow IPC) or, for CSV, a reader of record batches."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return pq.read_table(path)
    if suffix in _IPC_SUFFIXES:
        return ipc.open_file(pa.memory_map(str(path))).read_all()  # memory-mapped, no copy
    if suffix == ".csv":
        options = dict(csv_options or {})
        return pacsv.read_csv(path, **options) if whole else pacsv.open_csv(path, **options)
    raise TypeError(
        f"cannot tell the format of {path.name!r}: use .parquet, .arrow, .feather, .ipc or .csv"
    )


def _arrow_table_source(
    schema: Any,
    rows: int,
    batches: Callable[[int], Iterator[Any]],
    categories: Mapping[str, Sequence[str]],
    subject_id: str | None,
    cleanup: Callable[[], None] | None,
    nulls: Mapping[str, bool],
) -> TableSource:
    names = [str(n) for n in schema.names]
    if len(set(names)) != len(names):
        raise UploadRejectedError(f"the table names a column twice: {names[:10]}")
    types = {n: _numpy_type(n, schema.field(n).type, nulls.get(n, False)) for n in names}
    info = [ColumnInfo(n, t if t is not None else np.dtype(np.int64), ()) for n, t in types.items()]
    coders = {n: _coder(n, categories, subject_id) for n, t in types.items() if t is None}

    def read(block_rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
        for coder in coders.values():  # a second read codes subject ids the same way
            if coder.categories is None:
                coder.index.clear()
        for block in _rebatch(batches(block_rows), block_rows):
            yield {
                n: _to_numpy(n, block.column(i), types[n], coders.get(n))
                for i, n in enumerate(names)
            }

    return TableSource(info, rows, read, cleanup)


def arrow_columns(data: Any) -> dict[str, npt.NDArray[Any] | list[str | None]]:
    """An Arrow-like table (Polars, pyarrow) as in-memory columns, names and dtypes kept;
    strings as lists, which the node encodes against the declared categories.

    >>> import pyarrow as pa
    >>> arrow_columns(pa.table({"age": [30, 41], "sex": ["f", None]}))
    {'age': array([30, 41]), 'sex': ['f', None]}
    """
    table = _as_table(data)
    out: dict[str, npt.NDArray[Any] | list[str | None]] = {}
    for name in table.column_names:
        column = table.column(name)
        dtype = _numpy_type(name, column.type, column.null_count > 0)
        if dtype is None:
            array = column.combine_chunks()
            if hasattr(array, "dictionary_decode"):
                array = array.dictionary_decode()
            out[str(name)] = [None if v is None else str(v) for v in array.to_pylist()]
        else:
            out[str(name)] = _to_numpy(name, column, dtype, None)
    return out


def _as_table(data: Any) -> Any:
    import pyarrow as pa

    if isinstance(data, str | Path):
        data = _open_path(Path(data), None, whole=True)

    if type(data).__module__.split(".")[0] == "polars":
        if hasattr(data, "collect"):
            data = data.collect()
        return data.to_arrow()
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    return data if isinstance(data, pa.Table) else pa.table(data)


def session_request(
    manifest: Mapping[str, Any], source: TableSource, mock: TableSource | None
) -> tuple[dict[str, Any], Iterator[bytes]]:
    """The body that opens an upload session for ``source`` (and ``mock``), and its stream.

    ``manifest`` holds the declarations (name, tags, bounds, categories, clamp, fill,
    subject_id, ...); the columns, row counts, block size and tensors come from the sources.
    """
    block_rows = source.block_rows()
    tensors = [
        {"name": f"data/{c.name}", "dtype": c.dtype.name, "shape": list(c.row_shape)}
        for c in source.columns
    ]
    body = dict(manifest) | {
        "columns": [c.name for c in source.columns],
        "rows": source.rows,
        "block_rows": block_rows,
    }
    stream = source.stream(block_rows)
    if mock is not None:
        tensors += [
            {"name": f"mock/{c.name}", "dtype": c.dtype.name, "shape": list(c.row_shape)}
            for c in mock.columns
        ]
        body |= {"mock_columns": [c.name for c in mock.columns], "mock_rows": mock.rows}
        stream = itertools.chain(stream, mock.stream(block_rows))
    return body | {"tensors": tensors}, stream


def chunks_of(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``pieces`` regrouped into chunks of ``size`` bytes (the last one shorter).

    >>> [len(c) for c in chunks_of([b"abc", b"defgh", b"ij"], 4)]
    [4, 4, 2]
    """
    pending = bytearray()
    for piece in pieces:
        pending += piece
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)
