"""dpnode installs as a normal wheel: one namespace, migrations inside, no tests or benches.

The wheel is built from the checkout and unpacked into a folder that is put first on the
path of a fresh interpreter started outside the checkout, so what runs is the wheel's code,
not the editable install: the node migrates a new database from the migrations it ships.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL_STATE = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "dpnode-data",
    "__pycache__",
    ".*_cache",
    ".cache",  # s3rver's node_modules (scripts/ensure-s3rver): thousands of files
    ".hypothesis",  # written by hypothesis tests that another pytest-xdist worker may be running
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, so the build leaves nothing in the checkout and stale output can't leak in.
    source = tmp_path_factory.mktemp("source") / "dpnode"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LOCAL_STATE))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (found,) = out.glob("dpnode-*.whl")
    return found


def test_the_wheel_holds_one_namespace_with_its_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("dpnode-")}
    assert tops == {"dpnode"}
    for needed in (
        "dpnode/node/migrations/env.py",
        "dpnode/node/migrations/script.py.mako",
        "dpnode/node/migrations/versions/20261121_0001_initial_tables.py",
        "dpnode/policies/default.toml",
        "dpnode/py.typed",
        "dpnode/sdk/__init__.py",
        "dpnode/core/engine/__init__.py",
    ):
        assert needed in names, needed
    # every file of the package's source tree ships (templates, styles, policies, ...)
    tree = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "dpnode").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert tree - set(names) == set()
    versions = [n for n in names if n.startswith("dpnode/node/migrations/versions/")]
    shipped = sorted(p.name for p in (ROOT / "dpnode/node/migrations/versions").glob("*.py"))
    assert sorted(Path(n).name for n in versions) == shipped


def test_the_installed_wheel_migrates_a_new_database(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(site), "DPNODE_DATA_DIR": str(data)}
    where = subprocess.run(
        [sys.executable, "-c", "import dpnode.node.app, dpnode.node.db.migrate as m; "
         "print(m.MIGRATIONS_DIR)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site)
    done = subprocess.run(
        [sys.executable, "-m", "dpnode", "migrate"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (data / "dpnode.sqlite3").exists()
