"""The suite's root conftest keeps a module's tests on one pytest-xdist worker when they share
a module-scoped fixture, so that the fixture is built once a run (``make test`` runs
``pytest -n auto --dist loadgroup``). A change of pytest once lost the groups silently: every
test was scheduled on its own and such fixtures were built on both workers. This runs a small
suite through that conftest on two workers and reads where each test ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import importlib.util

spec = importlib.util.spec_from_file_location("suite_root_conftest", {str(REPO / "conftest.py")!r})
root = importlib.util.module_from_spec(spec)
spec.loader.exec_module(root)
pytest_collection_modifyitems = root.pytest_collection_modifyitems
"""

SHARED = """
import os
import time

import pytest


def _note(what):
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.fixture(scope="module")
def built():
    _note("built")
    return 1


@pytest.mark.parametrize("n", range(6))
def test_shared(built, n):
    time.sleep(0.05)
    _note("shared")
"""

ALONE = """
import time

import pytest


@pytest.mark.parametrize("n", range(6))
def test_alone(n):
    time.sleep(0.05)
"""


def test_a_module_fixture_is_built_once_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a_alone.py").write_text(ALONE)
    (tmp_path / "test_b_shared.py").write_text(SHARED)
    log = tmp_path / "ran.log"
    env = os.environ | {"RAN_LOG": str(log), "PYTHONPATH": str(REPO)}
    xdist = ["-n", "2", "--dist", "loadgroup", "--basetemp", str(tmp_path / "tmp")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 passed" in done.stdout, done.stdout
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [what for what, _ in lines].count("built") == 1, lines
    assert [what for what, _ in lines].count("shared") == 6, lines
    assert len({worker for _, worker in lines}) == 1, lines
