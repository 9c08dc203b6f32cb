"""The README walkthrough as a Jupyter notebook, run on a real kernel against a real node with
no network beyond loopback; the SDK's objects show as escaped HTML tables in its outputs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.e2e.conftest import REPO, Server
from tests.e2e.test_readme import walkthrough_blocks

# Every connection but to loopback fails inside the kernel: the notebook needs no network.
NO_NETWORK = """\
import ipaddress, socket

_connect = socket.socket.connect

def _loopback_only(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        try:
            ip = ipaddress.ip_address(address[0])
        except ValueError:
            ip = ipaddress.ip_address(socket.gethostbyname(address[0]))
        if not ip.is_loopback:
            raise OSError(f"no network in this notebook: {address[0]}")
    return _connect(self, address)

socket.socket.connect = _loopback_only
"""

#: What a notebook user looks at, one object a cell, and what its table must show.
DISPLAYS = {
    "ds": ["dataset &#x27;diabetes&#x27;", "<td>age</td>", "0, 120", "(442, 11)"],
    "age": ["remote tensor", "(442,)", "torch."],
    "released.receipt": ["receipt", "laplace", "charged epsilon 0.5"],
    # 10, and the 10 the admin step grants so that the walkthrough can be run again
    "client.budget()": ["privacy budget", "of 20 spent", "remaining_epsilon"],
    "client.ledger()": ["ledger", "laplace", "<th>epsilon</th>"],
    "fake.to_pandas().head()": ["<table", "age"],
    "visits": ["clinic_visits", "patient_id", "smoker"],
    "admin.policy()": ["policy", "<pre>"],
    # the builder's table: each statistic beside its 95% error bar, the scales folded in
    "older": [
        "query result",
        "<th>bmi_mean</th>",
        " ± ",
        " rows)</td>",
        "95% interval of its noise",
        "rows of rank",
        "split across 2 publish(es)",
    ],
}


def notebook(url: str) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_code_cell(NO_NETWORK)]
    cells += [
        nbformat.v4.new_code_cell(b.replace("http://127.0.0.1:8000", url))
        for b in walkthrough_blocks()
    ]
    cells += [nbformat.v4.new_code_cell(expression) for expression in DISPLAYS]
    return nbformat.v4.new_notebook(cells=cells)


def html_of(cell: Any) -> str:
    shown = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1, cell
    return str(shown[0])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_walkthrough_as_a_notebook_shows_html_tables(
    demo_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = notebook(demo_server.url)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    nbformat.write(nb, tmp_path / "walkthrough.ipynb")  # left for a person to open

    printed = "".join(o.get("text", "") for c in nb.cells for o in c.outputs)
    assert "(442, 11) (0.0, 120.0)" in printed and printed.count("refused:") == 2
    for cell, (expression, expected) in zip(
        nb.cells[-len(DISPLAYS) :], DISPLAYS.items(), strict=True
    ):
        assert cell.source == expression
        html = html_of(cell)
        for text in expected:
            assert text in html, (expression, text, html[:2000])
        assert not re.search(r"<script|https?://", html), expression  # no code, no assets
    shown = dict(zip(DISPLAYS, nb.cells[-len(DISPLAYS) :], strict=True))
    older = html_of(shown["older"])
    assert re.search(r"<td>\d[\d.]* ± \d[\d.]*</td>", older) and "_scale" not in older, older


def test_the_notebook_has_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(NO_NETWORK),
            nbformat.v4.new_code_cell(
                "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
                "except OSError as exc:\n    print(exc)"
            ),
        ]
    )
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    assert "no network in this notebook: 192.0.2.1" in nb.cells[1].outputs[0]["text"]
