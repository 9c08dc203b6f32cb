"""Several real nodes in this process, each with its own database: the sites of a federation."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.settings import Settings
from tests.conftest import PASSWORD, make_user


@dataclass
class Site:
    """One node: its URL, and its admin's, owner's and data scientist's sessions."""

    url: str
    admin: sdk.Client
    owner: sdk.Client
    scientist: sdk.Client


@contextmanager
def nodes(template: Path, root: Path, count: int) -> Iterator[list[Site]]:
    """``count`` nodes, ``http://site-0`` ..., each on a copy of the migrated ``template``
    database and served in process (``sdk.InProcessTransport``)."""
    with ExitStack() as stack:
        sites = []
        for k in range(count):
            where = root / f"site-{k}"
            where.mkdir()
            shutil.copy(template, where / "dpnode.sqlite3")
            settings = Settings(
                data_dir=where / "data",
                database_url=f"sqlite:///{where / 'dpnode.sqlite3'}",
                argon2_memory_kib=8 * 1024,
                argon2_time_cost=1,
            )
            context = NodeContext.from_settings(settings)
            stack.callback(context.close)
            transport = stack.enter_context(sdk.InProcessTransport(create_app(context=context)))
            url = f"http://site-{k}"
            logins = []
            for email, role in (
                ("admin@example.org", "admin"),
                ("owner@example.org", "data_owner"),
                ("ds@example.org", "data_scientist"),
            ):
                make_user(context, email, role)
                client = sdk.login(url, email=email, password=PASSWORD, transport=transport)
                stack.callback(client.close)
                logins.append(client)
            sites.append(Site(url, *logins))
        yield sites
