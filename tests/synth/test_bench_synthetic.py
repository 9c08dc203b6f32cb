"""The synthetic-data bench measures what it says (bench/synth_tables.py, synth_metrics.py,
synthetic.py), and its SmartNoise worker runs at the guarantee it states (only where
``.venv-smartnoise`` exists: bash bench/smartnoise_env.sh; CI has no such environment)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys

import numpy as np
import pytest

from bench import synth_metrics, synth_tables, synthetic
from bench.synth_metrics import accuracy, marginal_error
from bench.synth_tables import TABLES, Table

CATEGORICAL8 = TABLES["categorical8"](0)


def test_the_metrics_doctests_hold() -> None:
    for module in (synth_metrics, synthetic):
        assert doctest.testmod(module).failed == 0


def test_marginal_error_of_a_table_against_itself_is_zero() -> None:
    table = CATEGORICAL8
    assert marginal_error(table.train, table.train, table.sizes) == 0.0
    # the order of the rows is no marginal's business
    shuffled = table.train[np.random.default_rng(0).permutation(table.train.shape[0])]
    assert marginal_error(table.train, shuffled, table.sizes) == pytest.approx(0.0, abs=1e-12)


def test_marginal_error_sees_a_broken_dependency() -> None:
    # shuffling one column keeps every 1-way marginal and breaks its 2-way ones
    table = CATEGORICAL8
    broken = table.train.copy()
    broken[:, 3] = np.random.default_rng(1).permutation(broken[:, 3])
    error = marginal_error(table.train, broken, table.sizes)
    one_way = [
        marginal_error(table.train[:, [j]], broken[:, [j]], [table.sizes[j]])
        for j in range(len(table.sizes))
    ]
    assert max(one_way) == pytest.approx(0.0, abs=1e-12)
    assert error > 0.02


def test_accuracy_is_high_on_a_separable_table_and_chance_on_noise() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 4, (2000, 3))
    separable = np.column_stack([x, (x[:, 0] >= 2).astype(np.int64)])
    sizes = [4, 4, 4, 2]
    assert accuracy(separable[:1500], separable[1500:], sizes, target=3) > 0.99
    noise = np.column_stack([x, rng.integers(0, 2, 2000)])
    assert abs(accuracy(noise[:1500], noise[1500:], sizes, target=3) - 0.5) < 0.1
    # one class in the synthetic rows: that class is the prediction
    single = separable[:1500].copy()
    single[:, 3] = 1
    expected = float(np.mean(separable[1500:, 3] == 1))
    assert accuracy(single, separable[1500:], sizes, target=3) == expected


@pytest.mark.parametrize("name", list(TABLES))
def test_the_tables_are_binned_within_their_domain_with_rows_held_out(name: str) -> None:
    table: Table = TABLES[name](20_000)
    rows = table.train.shape[0] + table.test.shape[0]
    assert table.test.shape[0] == int(rows * synth_tables.TEST_SHARE)
    for codes in (table.train, table.test):
        assert codes.shape[1] == len(table.sizes)
        assert (codes >= 0).all() and (codes < np.array(table.sizes)).all()
    assert 0 <= table.target < len(table.sizes)
    assert len(np.unique(table.test[:, table.target])) >= 2


def test_the_generated_tables_are_what_the_issue_asks() -> None:
    assert len(CATEGORICAL8.sizes) >= 8
    mixed = TABLES["mixed"](20_000)
    assert mixed.train.shape[0] + mixed.test.shape[0] >= 20_000
    numeric = [a for a in mixed.attributes if a.width is not None]
    categorical = [a for a in mixed.attributes if a.width is None]
    assert len(numeric) >= 3 and len(categorical) >= 3
    # dependent columns: the real table is far from its independent model
    rng = np.random.default_rng(3)
    independent = np.stack([rng.permutation(c) for c in CATEGORICAL8.train.T], axis=1)
    assert marginal_error(CATEGORICAL8.train, independent, CATEGORICAL8.sizes) > 0.05


needs_smartnoise = pytest.mark.skipif(
    not synthetic.smartnoise_python().exists(),
    reason="no SmartNoise environment (bash bench/smartnoise_env.sh creates .venv-smartnoise)",
)


@needs_smartnoise
def test_the_smartnoise_worker_synthesizes_within_the_domain_at_the_stated_rho() -> None:
    rng = np.random.default_rng(4)
    first = rng.integers(0, 3, 600)
    train = np.column_stack([first, (first + rng.integers(0, 2, 600)) % 4, rng.integers(0, 2, 600)])
    attrs = CATEGORICAL8.attributes[:3]  # sizes 3, 4, 2
    table = Table("tiny", attrs, train, train[:10], target=2)
    synthetic_codes, seconds = synthetic.smartnoise(table, "mst", [1.0], [0])[1.0]
    assert synthetic_codes[0].shape == train.shape and seconds[0] > 0
    assert (synthetic_codes[0] < np.array(table.sizes)).all()
    # the epsilon the worker hands SmartNoise is, by SmartNoise's own conversion, the
    # add/remove rho that replace-one at calibrate_rho(1, delta) allows MST
    rho = synthetic.accounting.calibrate_rho(1.0, synthetic.DELTA)
    script = (
        "import sys, json; sys.path.insert(0, 'bench'); import smartnoise_worker as w;"
        "from snsynth.utils import cdp_rho;"
        f"e = w.epsilon_for({rho} / w.REPLACE_ONE_FACTOR['mst'], {synthetic.DELTA});"
        f"print(json.dumps([e, cdp_rho(e, {synthetic.DELTA})]))"
    )
    out = subprocess.run(
        [str(synthetic.smartnoise_python()), "-c", script],
        cwd=synthetic.ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    epsilon, their_rho = json.loads(out.strip().splitlines()[-1])
    assert 0 < epsilon < 1.0
    assert their_rho <= rho * 3 / 8 and their_rho == pytest.approx(rho * 3 / 8, rel=1e-6)


def test_the_bench_skips_a_method_dpnode_does_not_have(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # as on a branch without AIM: the method is skipped with a note, the run goes on
    monkeypatch.delattr(sys.modules["dpnode.core.synth"], "run_aim", raising=False)
    synthetic.compare([], ["aim"], 1, 0, None)
    assert "no run_aim yet: aim skipped" in capsys.readouterr().out
