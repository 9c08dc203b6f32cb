"""The layout of a chunked upload's byte stream: any chunking puts every byte in its place."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.node.services.uploads import UploadPart, UploadPlan


def _plan(rows: int, mock_rows: int | None, dtypes: list[str], block_rows: int) -> UploadPlan:
    parts = [UploadPart(f"data/c{i}", d, [1 + i % 2]) for i, d in enumerate(dtypes)]
    if mock_rows is not None:
        parts += [UploadPart(f"mock/c{i}", d, [1 + i % 2]) for i, d in enumerate(dtypes)]
    return UploadPlan(
        name="t",
        description="",
        tags=[],
        columns=[f"c{i}" for i in range(len(dtypes))],
        bounds={},
        categories={},
        clamp=False,
        fill={},
        subject_id=None,
        rows=rows,
        block_rows=block_rows,
        parts=parts,
        mock_columns=[f"c{i}" for i in range(len(dtypes))] if mock_rows else None,
        mock_rows=mock_rows,
    )


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 60),
    mock_rows=st.none() | st.integers(1, 20),
    dtypes=st.lists(
        st.sampled_from(["int8", "int16", "float32", "float64", "bool"]), min_size=1, max_size=4
    ),
    block_rows=st.integers(1, 70),
    cuts=st.lists(st.integers(1, 200), max_size=30),
)
def test_any_chunking_fills_each_column_file_exactly(
    rows: int,
    mock_rows: int | None,
    dtypes: list[str],
    block_rows: int,
    cuts: list[int],
) -> None:
    plan = _plan(rows, mock_rows, dtypes, block_rows)
    rng = np.random.default_rng(rows)
    arrays = []
    stream = bytearray()
    for section_rows, parts in plan.sections():
        columns = [rng.bytes(section_rows * p.row_bytes) for p in parts]
        arrays += columns
        for start in range(0, section_rows, block_rows):
            for p, column in zip(parts, columns, strict=True):
                stream += column[start * p.row_bytes : (start + block_rows) * p.row_bytes]
    assert len(stream) == plan.size
    files = [bytearray(len(a)) for a in arrays]
    offset = 0
    for cut in [*cuts, plan.size]:
        length = min(cut, plan.size - offset)
        for part, at, start, n in plan.pieces(offset, length):
            files[part][at : at + n] = stream[offset + start : offset + start + n]
        offset += length
        if offset == plan.size:
            break
    assert [bytes(f) for f in files] == arrays
