"""bench/moments.py's OpenDP side: each measurement loses the row's epsilon for a replaced row,
and with little noise its releases decode to the exact statistics."""

from __future__ import annotations

import numpy as np
import pytest

from bench.moments import (
    CENSUS_BOUNDS,
    REPLACE_ONE,
    ROWS,
    WINE_BOUNDS,
    census,
    opendp_release,
    truth,
    wine,
)


@pytest.fixture(scope="module")
def tables() -> dict[str, tuple[dict[str, np.ndarray], dict[str, tuple[float, float]]]]:
    return {"census": (census(), CENSUS_BOUNDS), "wine": (wine(), WINE_BOUNDS)}


@pytest.mark.parametrize("row", [r for r in ROWS if len(r.columns) <= 3], ids=lambda r: r.name)
@pytest.mark.parametrize("same_vector", [False, True])
def test_opendp_side_is_private_and_decodes_to_the_statistic(
    tables: dict, row: object, same_vector: bool
) -> None:
    data, bounds = tables[row.table]  # type: ignore[attr-defined]
    measurement, _ = opendp_release(row, data, bounds, 1.0, same_vector)  # type: ignore[arg-type]
    assert measurement.map(REPLACE_ONE) == pytest.approx(1.0, rel=1e-6)
    assert measurement.map(REPLACE_ONE) <= 1.0
    _, release = opendp_release(row, data, bounds, 200.0, same_vector)  # type: ignore[arg-type]
    exact = truth(row, data)  # type: ignore[arg-type]
    # epsilon 200: the noise is a few hundredths on sums of the rows' moments; a decoding
    # slip (a square's offset, a weight) would be off by the row count
    assert np.allclose(release(), exact, rtol=0.05, atol=0.01 * np.abs(exact).max())
