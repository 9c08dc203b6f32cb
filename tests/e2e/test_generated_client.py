"""A client generated from the node's /openapi.json by openapi-python-client works against a
real node: it logs in, lists datasets, reads an error body and downloads a tensor frame."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from dpnode.node.api import frames
from dpnode.node.demo import ACCOUNTS
from tests.e2e.conftest import Server

_, _, SCIENTIST = ACCOUNTS
PACKAGE = "dpnode_generated_client"
# The node's frame media type is binary to a generator: it reads the bytes as a File.
CONFIG = "content_type_overrides:\n  application/vnd.dpnode.tensors: application/octet-stream\n"


def generate(spec: bytes, where: Path) -> None:
    (where / "openapi.json").write_bytes(spec)
    (where / "config.yaml").write_text(CONFIG)
    bin_dir = Path(sys.executable).parent  # the generator formats its output with ruff
    command = [sys.executable, "-m", "openapi_python_client", "generate", "--path"]
    command += ["openapi.json", "--config", "config.yaml", "--meta", "none"]
    done = subprocess.run(
        [*command, "--output-path", PACKAGE],
        cwd=where,
        env=os.environ | {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # a construct the generator cannot read is a warning, and the operation goes missing
    assert "WARNING" not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.fixture
def generated(tmp_path: Path, demo_server: Server) -> Any:
    generate(httpx.get(demo_server.url + "/openapi.json").content, tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_generated_client_logs_in_and_lists_datasets(generated: Any, demo_server: Server) -> None:
    auth = importlib.import_module(f"{PACKAGE}.api.auth.login")
    listing = importlib.import_module(f"{PACKAGE}.api.datasets.list_datasets")
    one = importlib.import_module(f"{PACKAGE}.api.datasets.get_dataset")
    mock = importlib.import_module(f"{PACKAGE}.api.datasets.download_mock")
    models = importlib.import_module(f"{PACKAGE}.models")

    anonymous = generated.Client(base_url=demo_server.url)
    refused = auth.sync_detailed(
        client=anonymous, body=models.LoginRequest(email=SCIENTIST.email, password="wrong")
    )
    assert refused.status_code == 401 and refused.parsed.error == "unauthenticated"
    token = auth.sync(
        client=anonymous,
        body=models.LoginRequest(email=SCIENTIST.email, password=SCIENTIST.password),
    )
    client = generated.AuthenticatedClient(base_url=demo_server.url, token=token.access_token)

    datasets = listing.sync(client=client, tags=["health"])
    names = {d.name for d in datasets}
    assert {"diabetes", "breast_cancer"} <= names
    diabetes = next(d for d in datasets if d.name == "diabetes")
    assert diabetes.row_count == 442 and diabetes.columns[0].name == "age"

    missing = one.sync_detailed("no-such-dataset", client=client)
    assert missing.status_code == 404
    assert isinstance(missing.parsed, models.Error) and missing.parsed.error == "not_found"

    frame = mock.sync("diabetes", client=client)
    manifest, arrays = frames.decode(frame.payload.read(), max_elements=10**7)
    assert manifest["kind"] == "mock" and arrays["age"].shape[0] == diabetes.mock_row_count
