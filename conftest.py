"""The suite's root: what is collected, and how pytest-xdist may spread it over processes."""

from __future__ import annotations

import pytest

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
    for item in items:
        # _fixtureinfo: pytest has no public way to ask an item for its fixtures' scopes
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
