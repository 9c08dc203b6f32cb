"""The suite's root: what is collected, how pytest-xdist may spread it over processes, and the
engine's conformance tables printed at the end of a session.

The hooks that print live here because this file is loaded by every pytest process, among them
the pytest-xdist controller, which runs no test and so never loads tests/engine/conftest.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.engine import tallies

# Doctests are collected from the packages too; running the CLI entry point is not a test.
collect_ignore = ["dpnode/node/__main__.py"]

#: Fixture scopes wider than one test and narrower than the session (which each worker has).
_SHARED_SCOPES = frozenset({"package", "module", "class"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep on one pytest-xdist worker each module whose tests share a wider-scoped fixture.

    ``make test`` runs ``pytest -n auto --dist loadgroup``: every test is scheduled on its own,
    but tests marked with one ``xdist_group`` run on one worker. Grouping each module that uses
    a module-, class- or package-scoped fixture (a node process, a browser, a 27 s sweep) builds
    that fixture once rather than once a worker, and keeps in order the tests that read what an
    earlier test left in it. A new test module gets this by its fixtures alone.
    """
    if not config.pluginmanager.hasplugin("xdist"):
        return
    # set on pytest-xdist's workers under --dist loadgroup: other runs keep their node ids
    loadgroup = bool(getattr(config.option, "loadgroup", False))
    for item in items:
        # _fixtureinfo: pytest has no public way to ask an item for its fixtures' scopes
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values()):
            group = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup:
                _tell_the_group(item, group)


def _tell_the_group(item: pytest.Item, group: str) -> None:
    """Name ``group`` in the item's node id, as ``path::test@group``, for pytest-xdist.

    pytest-xdist's workers tell its controller an item's group only by that suffix, which
    they write to ``item._nodeid``; pytest 9.2 keeps node ids in ``item._id`` (a ``NodeId``)
    and ignores the other, so the groups were lost and every test was scheduled on its own
    (pytest-xdist issue 1386): module fixtures were built on both workers, or again after
    another module's tests ran between two of a module's (the OpInfo sweep twice a run).
    Where pytest keeps a ``NodeId``, write the suffix there; pytest-xdist, if it adds its own
    later, adds the same name after it, and only the last ``@`` counts.
    """
    node_id = getattr(item, "_id", None)
    if node_id is not None and not isinstance(node_id, str) and hasattr(node_id, "parse"):
        item._id = node_id.parse(f"{node_id}@{group}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A pytest-xdist worker prints nothing: it hands its tallies to the controller.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["engine_tallies"] = tallies.as_wire(tallies.COUNTS, tallies.RESULTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: add up what each worker tallied (nothing if it crashed)."""
    wire = getattr(node, "workeroutput", {}).get("engine_tallies")
    if wire is not None:
        tallies.merge(wire, tallies.COUNTS, tallies.RESULTS)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The engine's type-promotion matrix and OpInfo conformance against torch, when run."""
    if tallies.RESULTS:
        terminalreporter.write_sep("-", "type-promotion matrix vs torch (cells per binary prim)")
        terminalreporter.write_line(tallies.matrix_summary())
    if not tallies.COUNTS:
        return
    table = tallies.summary_table()
    terminalreporter.write_sep("-", "engine conformance vs torch OpInfo (samples per op)")
    terminalreporter.write_line(table)
    path = os.environ.get("DPNODE_CONFORMANCE_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")
