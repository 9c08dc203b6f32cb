"""The upload contract over HTTP: bounds, clamping, fills, categories, dtypes, subjects.

Everything downstream (sensitivity, noise) trusts what this contract stores, so each
rule is checked through the real endpoint, with the refusal messages asserted exactly.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from dpnode.core.engine.subnormals import flush
from dpnode.node.services.tabular import MAX_CATEGORIES
from tests.node.conftest import refused, upload, upload_ok
from tests.node.frames import read_frame

DATASETS = "/api/v1/datasets"
_names = itertools.count()

#: Hypothesis runs many examples against one database (a fresh one per backend).
PROPERTY = hsettings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def download(http: TestClient, headers: dict[str, str], name: str) -> dict[str, Any]:
    response = http.get(f"{DATASETS}/{name}/data", headers=headers)
    assert response.status_code == 200, response.text
    return read_frame(response.content)[1]


def column(body: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in body["columns"] if c["name"] == name)
    return found


OUT_OF_BOUNDS = "; fix the bounds, or pass clamp=True to clip them"

#: (data, manifest keywords, expected message) for uploads the contract refuses.
REFUSED: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    (
        {"age": np.array([1, 2]), "bmi": np.array([20.0, 30.0])},
        {"bounds": {"age": (0, 120)}},
        "column 'bmi' has no declared bounds; pass bounds={'bmi': (low, high)}. The "
        "declarations are the public privacy contract every result's noise is calibrated to",
    ),
    (
        {"age": np.array([1, 130, 150, -1, 5])},
        {"bounds": {"age": (0, 120)}},
        "column 'age' has 3 values outside its declared bounds [0, 120]" + OUT_OF_BOUNDS,
    ),
    (
        {"a": np.array([1.0, 99.0]), "b": np.array([1.0, 99.0])},
        {"bounds": {"a": (0, 10), "b": (0, 10)}, "clamp": ["a"]},
        "column 'b' has 1 values outside its declared bounds [0, 10]" + OUT_OF_BOUNDS,
    ),
    (
        {"x": np.array([1.0, np.nan, np.inf, -np.inf])},
        {"bounds": {"x": (0, 10)}},
        "column 'x' has 3 NaN or infinite values; pass fill={'x': value} to replace them, or "
        "clean the data",
    ),
    (
        {"x": np.array([1.0, np.nan])},
        {"bounds": {"x": (0, 10)}, "fill": {"x": 11.0}},
        "fill value 11.0 for column 'x' lies outside its bounds [0, 10]",
    ),
    (
        {"sex": ["f", "m", "?", None, "m", "?"]},
        {"categories": {"sex": ["f", "m"]}},
        "column 'sex' has 3 values that are not among its declared categories ['f', 'm'] (for "
        "example ['?', 'None']); add them to the categories or clean the data",
    ),
    (
        {"sex": ["f", "m"]},
        {},
        "column 'sex' holds strings: declare its public category list, e.g. categories={'sex': "
        "['a', 'b']}. The declarations are the public privacy contract every result's noise is "
        "calibrated to",
    ),
    (  # every missing declaration at once, not one an attempt
        {
            "age": np.array([1, 2]),
            "bmi": np.array([20.0, 30.0]),
            "sex": ["f", "m"],
            "smoker": ["no", "yes"],
            "bp": np.array([80.0, 90.0]),
        },
        {"bounds": {"bp": (40, 200)}},
        "columns 'age', 'bmi' have no declared bounds; pass bounds={'age': (low, high), 'bmi': "
        "(low, high)}; and columns 'sex', 'smoker' hold strings: declare their public category "
        "list, e.g. categories={'sex': ['a', 'b'], 'smoker': ['a', 'b']}. The declarations are "
        "the public privacy contract every result's noise is calibrated to",
    ),
    (
        {"code": np.array([0, 1, 2], dtype=np.int64)},
        {"categories": {"code": ["a", "b"]}, "clamp": True},
        "column 'code' has 1 values outside its declared bounds [0, 1]" + OUT_OF_BOUNDS,
    ),
    (
        {"code": np.array([0.0, 1.5])},
        {"categories": {"code": ["a", "b"]}},
        "categorical column 'code' must hold whole category indices",
    ),
    (
        {"x": np.array([1, 2], dtype=np.int64)},
        {"bounds": {"x": (0.2, 0.8)}},
        "bounds of integer column 'x' contain no integer",
    ),
    (
        {"x": np.array([1, 2], dtype=np.uint8)},
        {"bounds": {"x": (300, 400)}, "clamp": True},
        "bounds [300, 400] of column 'x' hold no value its dtype uint8 can store",
    ),
    (
        {"x": np.array([1.0])},
        {"bounds": {"x": (5, 1)}},
        "bounds of column 'x' must be finite with low <= high, got (5.0, 1.0)",
    ),
    (
        {"x": np.array([1, 2], dtype=np.uint16)},
        {"bounds": {"x": (0, 10)}},
        "column 'x' has dtype uint16, which dpnode does not store; use one of: bool, float16, "
        "float32, float64, int16, int32, int64, int8, uint8 (strings: declare categories)",
    ),
    (
        {"x": np.array([1.0, 2.0]), "y": np.array([1.0])},
        {"bounds": {"x": (0, 5), "y": (0, 5)}},
        "columns must all have the same, non-zero number of rows; got {'x': 2, 'y': 1}",
    ),
    (
        {"x": np.zeros(0)},
        {"bounds": {"x": (0, 5)}},
        "columns must all have the same, non-zero number of rows; got {'x': 0}",
    ),
    (
        {"x": np.array([1.0])},
        {"bounds": {"x": (0, 5), "nope": (0, 1)}},
        "bounds declared for column 'nope', but the data has no such column",
    ),
    (
        {"x": np.array([1.0])},
        {"bounds": {"x": (0, 5)}, "clamp": ["x", "typo"]},
        "clamp declared for column 'typo', but the data has no such column",
    ),
    (
        {"x": np.array([1.0])},
        {"bounds": {"x": (0, 5)}, "subject_id": "who"},
        "data has no subject id column 'who'",
    ),
    (
        {"who": np.array([1, 2])},
        {"subject_id": "who"},
        "a dataset needs at least one column besides the subject id",
    ),
    (
        {"x": np.array([1.0])},
        {"bounds": {"x": (0, 5)}, "columns": ["x", "y"]},
        "column order ['x', 'y'] does not match the columns sent ['x']",
    ),
]


def test_the_contract_refuses_with_messages_naming_the_column(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    for data, manifest, message in REFUSED:
        response = upload(http, owner_h, "refused", data, **manifest)
        assert refused(response, 422, "upload_rejected") == message, (data, manifest)
    # Nothing was stored, and the node still takes a good upload.
    assert http.get(DATASETS, headers=owner_h).json() == []
    upload_ok(http, owner_h, "refused", {"x": np.array([1.0])}, bounds={"x": (0, 5)})


def test_clamp_true_clips_exactly_to_the_bounds(http: TestClient, owner_h: dict[str, str]) -> None:
    data = {"a": np.array([-5.0, 0.5, 12.0]), "b": np.array([-3, 4, 99], dtype=np.int32)}
    upload_ok(http, owner_h, "d", data, bounds={"a": (0, 10), "b": (0, 50)}, clamp=True)
    arrays = download(http, owner_h, "d")
    np.testing.assert_array_equal(arrays["a"], [0.0, 0.5, 10.0])
    np.testing.assert_array_equal(arrays["b"], [0, 4, 50])
    assert arrays["b"].dtype == np.int32


def test_clamp_a_list_of_columns_clips_only_those(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    data = {"a": np.array([-5.0, 12.0]), "b": np.array([1.0, 2.0])}
    upload_ok(http, owner_h, "d", data, bounds={"a": (0, 10), "b": (0, 10)}, clamp=["a"])
    np.testing.assert_array_equal(download(http, owner_h, "d")["a"], [0.0, 10.0])


def test_fill_replaces_nan_and_infinities(http: TestClient, owner_h: dict[str, str]) -> None:
    data = {"x": np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32)}
    upload_ok(http, owner_h, "d", data, bounds={"x": (0, 10)}, fill={"x": 2.5})
    arrays = download(http, owner_h, "d")
    assert arrays["x"].dtype == np.float32
    np.testing.assert_array_equal(arrays["x"], [1.0, 2.5, 2.5, 2.5])


def test_strings_are_stored_as_indices_into_the_declared_categories(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    body = upload_ok(
        http, owner_h, "d", {"c": ["b", "a", "c", "b"]}, categories={"c": ["c", "b", "a"]}
    )
    assert column(body, "c") == {
        "name": "c",
        "dtype": "int64",
        "shape": [],
        "bounds": [0.0, 2.0],
        "categories": ["c", "b", "a"],
    }
    np.testing.assert_array_equal(download(http, owner_h, "d")["c"], [1, 2, 0, 1])


def test_a_subnormal_bound_moves_outward_off_the_subnormals(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # values clamped to it were stored subnormal (flushed before they were clipped)
    for k, (dtype, bound) in enumerate(((np.float64, 1e-310), (np.float32, 1e-40))):
        data = {"x": np.array([0.0, 0.5, -1.0], dtype=dtype)}
        bounds = {"x": (-bound, bound)}
        body = upload_ok(http, owner_h, f"sub{k}", data, bounds=bounds, clamp=True)
        tiny = float(np.finfo(dtype).tiny)
        assert column(body, "x")["bounds"] == [-tiny, tiny]
        back = download(http, owner_h, f"sub{k}")["x"]
        assert back.tolist() == [0.0, tiny, -tiny]  # normal, not subnormal


def test_more_categories_than_allowed_are_refused(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # every catalog listing carries a column's categories: 2 million made each one 20 MB
    many = [f"c{i}" for i in range(MAX_CATEGORIES + 1)]
    response = upload(
        http, owner_h, "d", {"c": np.zeros(2, dtype=np.int64)}, categories={"c": many}
    )
    assert response.status_code == 422, response.text
    assert f"at most {MAX_CATEGORIES} are allowed" in response.json()["detail"]


def test_subnormal_values_are_stored_as_zeros(http: TestClient, owner_h: dict[str, str]) -> None:
    """The engine's arithmetic never meets a subnormal value (its time would count them:
    dpnode.core.engine.subnormals), so uploads store them as +0."""
    data = {
        "d": np.array([1e-310, -1e-310, 0.5, -2.0]),
        "f": np.array([1e-40, -1e-40, 0.5, 3.0], dtype=np.float32),
    }
    upload_ok(http, owner_h, "d", data, bounds={"d": (-2, 1), "f": (-1, 3)})
    back = download(http, owner_h, "d")
    assert back["d"].tolist() == [0.0, 0.0, 0.5, -2.0]
    assert back["f"].tolist() == [0.0, 0.0, 0.5, 3.0] and back["f"].dtype == np.float32
    assert not np.any(np.signbit(back["d"][:2])) and not np.any(np.signbit(back["f"][:2]))


def test_bool_columns_are_bounded_by_zero_and_one(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    body = upload_ok(http, owner_h, "d", {"b": np.array([True, False])}, bounds={"b": (-9, 9)})
    assert column(body, "b")["bounds"] == [0.0, 1.0]
    assert download(http, owner_h, "d")["b"].dtype == np.bool_


def test_integer_bounds_tighten_to_integers_and_the_dtype(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    data = {"i": np.array([1, 10], dtype=np.int64), "small": np.array([-5, 50], dtype=np.int8)}
    body = upload_ok(http, owner_h, "d", data, bounds={"i": (0.5, 10.5), "small": (-1000, 50)})
    assert column(body, "i")["bounds"] == [1.0, 10.0]
    assert column(body, "small")["bounds"] == [-128.0, 50.0]


def test_clamping_an_integer_column_whose_bounds_exceed_its_dtype(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # Bounds beyond int8/uint8 used to be cast into the dtype before clipping, wrapping
    # around: -1000 became 24 and -5 became 251, and clamping rewrote in-bound values.
    data = {
        "s": np.array([-5, 100, 7], dtype=np.int8),
        "u": np.array([3, 200, 0], dtype=np.uint8),
    }
    body = upload_ok(http, owner_h, "d", data, bounds={"s": (-1000, 50), "u": (-5, 10)}, clamp=True)
    assert column(body, "u")["bounds"] == [0.0, 10.0]
    arrays = download(http, owner_h, "d")
    np.testing.assert_array_equal(arrays["s"], [-5, 50, 7])
    np.testing.assert_array_equal(arrays["u"], [3, 10, 0])


def test_float32_bounds_widen_so_stored_values_respect_them(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # float32(0.1) is slightly above 0.1: it must be accepted, and the bound must cover it.
    tenth = np.float32(0.1)
    body = upload_ok(
        http, owner_h, "d", {"x": np.array([0.0, tenth], dtype=np.float32)}, bounds={"x": (0, 0.1)}
    )
    lower, upper = column(body, "x")["bounds"]
    assert lower == 0.0
    assert upper == float(tenth) and upper >= 0.1
    assert np.float32(upper) == tenth


def test_float16_bounds_beyond_its_range_stay_finite(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # float16 holds at most 65504: a declared 1e6 used to become an infinite bound.
    body = upload_ok(
        http,
        owner_h,
        "d",
        {"h": np.array([1.0, -2.0], dtype=np.float16)},
        bounds={"h": (-1e6, 1e6)},
    )
    assert column(body, "h")["bounds"] == [-65504.0, 65504.0]


def test_subject_id_column_may_be_the_only_string_column(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    body = upload_ok(
        http,
        owner_h,
        "d",
        {"x": np.arange(4.0), "who": ["a", "b", "a", "a"]},
        bounds={"x": (0, 3)},
        subject_id="who",
    )
    assert (body["subject_count"], body["max_rows_per_subject"]) == (2, 3)


def _bounds_and_values(dtype: np.dtype[Any]) -> st.SearchStrategy[tuple[float, float, Any]]:
    if dtype.kind == "f":
        width = dtype.itemsize * 8
        scalar = st.floats(-1e4, 1e4, width=width, allow_nan=False, allow_subnormal=False)
    else:
        info = np.iinfo(dtype)
        scalar = st.integers(max(int(info.min), -(2**53)), min(int(info.max), 2**53))

    @st.composite
    def pick(draw: st.DrawFn) -> tuple[float, float, Any]:
        lower, upper = sorted((draw(scalar), draw(scalar)))
        elements = (
            st.floats(lower, upper, width=dtype.itemsize * 8, allow_subnormal=False)
            if dtype.kind == "f"
            else st.integers(lower, upper)
        )
        shape = draw(st.sampled_from([(7,), (3, 2), (2, 2, 2)]))
        values = draw(hnp.arrays(dtype, shape, elements=elements))
        return float(lower), float(upper), values

    return pick()


DTYPES = ["int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]


@PROPERTY
@given(data=st.data())
def test_values_inside_their_bounds_round_trip_exactly(
    http: TestClient, owner_h: dict[str, str], data: st.DataObject
) -> None:
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES)))
    lower, upper, values = data.draw(_bounds_and_values(dtype))
    name = f"roundtrip-{next(_names)}"
    body = upload_ok(http, owner_h, name, {"x": values}, bounds={"x": (lower, upper)})
    stored_lower, stored_upper = column(body, "x")["bounds"]
    assert column(body, "x")["shape"] == list(values.shape[1:])
    assert stored_lower <= values.min() and values.max() <= stored_upper
    back = download(http, owner_h, name)["x"]
    assert back.dtype == values.dtype and back.shape == values.shape
    if dtype.kind == "f":  # exactly, but for a zero's sign, which the node drops on purpose
        assert not np.any(np.signbit(back) & (back == 0))
        values = values + dtype.type(0.0)
    assert back.tobytes() == values.tobytes()


@PROPERTY
@given(
    values=hnp.arrays(
        np.float64, st.integers(1, 40), elements=st.floats(-100, 100, allow_subnormal=False)
    ),
    bounds=st.tuples(st.integers(-100, 100), st.integers(-100, 100)).map(sorted),
)
def test_out_of_bound_values_are_counted_exactly(
    http: TestClient, owner_h: dict[str, str], values: Any, bounds: list[int]
) -> None:
    lower, upper = bounds
    expected = int(np.sum((values < lower) | (values > upper)))
    response = upload(http, owner_h, f"count-{next(_names)}", {"x": values}, bounds={"x": bounds})
    if expected == 0:
        assert response.status_code == 201, response.text
    else:
        assert refused(response, 422, "upload_rejected") == (
            f"column 'x' has {expected} values outside its declared bounds "
            f"[{lower:g}, {upper:g}]" + OUT_OF_BOUNDS
        )


def _expected_bounds(dtype: np.dtype[Any], lower: float, upper: float) -> tuple[float, float]:
    """The bounds the node must store: integers within the dtype, or the tightest floats
    of the dtype that still contain the declared ones."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(max(math.ceil(lower), info.min)), float(min(math.floor(upper), info.max))
    lo, hi = dtype.type(lower), dtype.type(upper)
    if float(lo) > lower:
        lo = np.nextafter(lo, dtype.type(-np.inf))
    if float(hi) < upper:
        hi = np.nextafter(hi, dtype.type(np.inf))
    tiny = float(np.finfo(dtype).tiny)  # and off the subnormals, outward
    low = float(lo) if abs(float(lo)) >= tiny else (-tiny if float(lo) < 0 else 0.0)
    high = float(hi) if abs(float(hi)) >= tiny else (tiny if float(hi) > 0 else 0.0)
    return low, high


@PROPERTY
@given(data=st.data())
def test_clamping_moves_only_out_of_bound_values_onto_the_bounds(
    http: TestClient, owner_h: dict[str, str], data: st.DataObject
) -> None:
    dtype = np.dtype(data.draw(st.sampled_from(["int8", "uint8", "int32", "float32", "float64"])))
    finite = {"allow_nan": False, "allow_infinity": False} if dtype.kind == "f" else None
    values = data.draw(hnp.arrays(dtype, st.integers(1, 30), elements=finite))
    bound = st.floats(-1e3, 1e3, allow_subnormal=False)
    lower, upper = sorted(data.draw(st.tuples(bound, bound)))
    if dtype.kind in "iu":  # bounds that hold no value of the dtype are refused (tested above)
        info = np.iinfo(dtype)
        assume(math.ceil(lower) <= math.floor(upper) and lower <= info.max and upper >= info.min)
    name = f"clamp-{next(_names)}"
    response = upload(http, owner_h, name, {"x": values}, bounds={"x": (lower, upper)}, clamp=True)
    assert response.status_code == 201, response.text
    stored_lower, stored_upper = column(response.json(), "x")["bounds"]
    assert (stored_lower, stored_upper) == _expected_bounds(dtype, lower, upper)
    back = download(http, owner_h, name)["x"]
    assert back.dtype == dtype
    values = flush(values)  # stored as zeros (test_subnormal_values_are_stored_as_zeros)
    inside = (values >= stored_lower) & (values <= stored_upper)
    np.testing.assert_array_equal(back[inside], values[inside])
    assert np.all(back[values < stored_lower] == dtype.type(stored_lower))
    assert np.all(back[values > stored_upper] == dtype.type(stored_upper))


def test_clamp_must_be_a_boolean_or_a_list_of_columns(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    response = upload(
        http, owner_h, "lenient", {"x": np.array([9.0])}, bounds={"x": (0, 5)}, clamp="yes"
    )
    body = refused(response, 422, "invalid_request")
    assert body.startswith("invalid dataset manifest") and "clamp" in body
    assert http.get(DATASETS, headers=owner_h).json() == []
