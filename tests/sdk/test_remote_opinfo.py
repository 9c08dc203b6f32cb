"""The OpInfo sweep (see ``opinfo_sweep.py``) on a fixed seventh of torch's OpInfo entries.

The whole sweep takes minutes; this test runs every seventh entry (in name order)
with two samples each, so that the suite stays fast while still covering every
family of ops. ``DPNODE_FULL_OPINFO=1`` runs all entries with three samples.
Nothing may compute a wrong value; unsupported ops are counted, and the pass
rate may not fall below what the SDK reached when this test was written.
"""

from __future__ import annotations

import os

import pytest

from tests.sdk import opinfo_sweep
from tests.sdk.opinfo_sweep import ENTRIES, summary, sweep

#: entries whose "wrong" outcome is a limitation of the sweep, not of the SDK
KNOWN_WRONG = {
    # the samples take views of a larger buffer and read outside them; a remote input is a
    # standalone tensor (the SDK refuses as_strided outside it rather than read garbage)
    "as_strided.partial_views",
    # torch's float32 matrix_exp of OpInfo's batched sample differs from torch's own float64
    # result by more than the float32 tolerance; the node computes in float64 and is the
    # closer one (tests/engine/test_special_and_matrix.py checks it against torch)
    "matrix_exp",
}
#: the pass rate (value-dependent entries excluded) measured on this subset
FLOOR = 0.90


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], tuple[str, str]]:
    full = os.environ.get("DPNODE_FULL_OPINFO") == "1"
    names = sorted(ENTRIES) if full else sorted(ENTRIES)[::7]
    opinfo_sweep.MAX_SAMPLES = 3 if full else 2
    res = sweep(names)
    print("\n" + summary(res))
    return res


def test_no_remote_op_computes_a_wrong_value(
    results: dict[tuple[str, str], tuple[str, str]],
) -> None:
    wrong = [
        f"{n} {d}: {why}"
        for (n, d), (o, why) in results.items()
        if o == "wrong" and n not in KNOWN_WRONG
    ]
    assert not wrong, "\n".join(wrong)


def test_value_dependent_ops_raise_private_value_error(
    results: dict[tuple[str, str], tuple[str, str]],
) -> None:
    assert any(o == "value_dependent" for o, _ in results.values()) or len(results) < 50


def test_pass_rate_does_not_regress(results: dict[tuple[str, str], tuple[str, str]]) -> None:
    counted = [o for o, _ in results.values() if o != "value_dependent"]
    rate = counted.count("pass") / len(counted)
    assert rate >= FLOOR, f"pass rate {rate:.1%} fell below {FLOOR:.0%}\n{summary(results)}"
