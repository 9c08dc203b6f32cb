"""``make wheel``'s wheel, installed with ``[sdk]`` into a fresh virtual environment away from
the clone, logs in to a real node and publishes; its ``dpnode`` command runs.

Offline: the wheel is built with the setuptools already installed (no build isolation), and
installed with ``--no-index``; its dependencies are the ones this suite runs with, seen through
a folder of links to them (never the clone, nor an installed dpnode), so pip finds them
installed and downloads nothing.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from dpnode import __version__
from tests.e2e.conftest import REPO, Server

#: What must ship inside the wheel besides the modules (pyproject's package-data).
DATA_FILES = [
    "dpnode/py.typed",
    "dpnode/policies/default.toml",
    "dpnode/node/migrations/env.py",
    "dpnode/node/migrations/script.py.mako",
    "dpnode/node/console/templates/users.html",
    "dpnode/node/console/static/console.css",
]

LOGIN = """
import dpnode
from dpnode import sdk

client = sdk.login(URL, email="ds@example.org", password="ds-demo-password")
ds = client.dataset("diabetes")
print("from", dpnode.__file__)
print("published", ds["age"].float().mean().publish(epsilon=0.5).item())
print(client.budget())
"""


def _build(tmp_path: Path) -> Path:
    """``pip wheel`` on a copy of the project (the clone gets no build/ or egg-info)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((REPO / name).read_bytes())
    files = subprocess.run(
        ["git", "ls-files", "dpnode"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((REPO / name).read_bytes())
    dist = tmp_path / "dist"
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", str(dist)]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("dpnode-*.whl")
    return wheel


def _dependencies_view(tmp_path: Path) -> Path:
    """Links to every installed package this interpreter sees but dpnode itself."""
    view = tmp_path / "installed"
    view.mkdir()
    seen: set[str] = set()
    for folder in [*site.getsitepackages(), *sys.path]:
        path = Path(folder)
        if not path.is_dir() or path.resolve() == REPO.resolve() or "site-packages" not in folder:
            continue
        for entry in path.iterdir():
            name = entry.name
            if name in seen or name.endswith(".pth") or "dpnode" in name.lower():
                continue
            seen.add(name)
            (view / name).symlink_to(entry)
    return view


def _fresh_env(tmp_path: Path, view: Path) -> Path:
    home = tmp_path / "analyst-env"
    # no pip of its own: ensurepip would also put an old setuptools before the view's, which
    # torch's requirements refuse (pip runs from here with --python)
    venv.EnvBuilder(with_pip=False).create(home)
    (purelib,) = (home / "lib").glob("python*/site-packages")
    (purelib / "installed-elsewhere.pth").write_text(f"{view}\n")
    return home


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_wheel_installs_with_the_sdk_and_logs_in(demo_server: Server, tmp_path: Path) -> None:
    wheel = _build(tmp_path)
    assert wheel.name == f"dpnode-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [f for f in DATA_FILES if f not in names], sorted(names)
    assert any(n.startswith("dpnode/node/migrations/versions/") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    home = _fresh_env(tmp_path, _dependencies_view(tmp_path))
    python = home / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    offline = ["--no-index", "--find-links", str(wheel.parent), "--disable-pip-version-check"]
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            *offline,
            f"{wheel}[sdk]",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    if installed.returncode and "No matching distribution found" in installed.stderr:
        pytest.skip(
            f"a dependency of dpnode[sdk] is not installed here (offline):\n{installed.stderr}"
        )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    script = f"URL = {demo_server.url!r}\n" + LOGIN
    ran = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    # the wheel's own copy, not the clone
    assert f"from {home}/lib/" in ran.stdout and "site-packages/dpnode/__init__.py" in ran.stdout
    assert "published " in ran.stdout and "epsilon: 0.5 of 10 spent" in ran.stdout
    command = subprocess.run(
        [str(home / "bin" / "dpnode"), "--version"], capture_output=True, text=True, env=env
    )
    assert command.stdout.strip() == f"dpnode {__version__}", command.stderr
