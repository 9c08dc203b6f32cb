"""Search across a network of nodes, and log in to its members one by one.

A network (``dpnode serve --network``) lists its members' public catalogs; it holds no
accounts of theirs, so logging in stays per node: each site keeps its own users and policy.
A search answers a :class:`~dpnode.sdk.DatasetHandle` (bound to that node's own client) for
the datasets of nodes you logged in to, and a :class:`DatasetListing` (public metadata only)
for the others.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from dpnode.sdk._client import API_PREFIX, Client, _busy_wait, node_url
from dpnode.sdk._client_uploads import _tags
from dpnode.sdk._exceptions import (
    NodeBusyError,
    NodeUnreachableError,
    NotFoundError,
    raise_for_error,
)
from dpnode.sdk._handles import ColumnInfo, DatasetHandle, NodeRef, columns_from_json

__all__ = ["DatasetListing", "Network", "NodeInfo", "network"]


@dataclass(frozen=True)
class NodeInfo:
    """A member of a network: where it is, whether it answers, how many datasets it lists."""

    name: str
    url: str
    reachable: bool
    last_seen_at: datetime
    datasets: int


@dataclass(frozen=True)
class DatasetListing:
    """A dataset a network lists on a node you have not logged in to: public metadata only.
    Log in to its node (``net.login(listing.node.name, ...)``) to compute on it."""

    name: str
    description: str
    tags: list[str]
    row_count: int
    columns: dict[str, ColumnInfo]
    subject_id: str | None
    subject_count: int
    has_mock: bool
    node: NodeRef

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns)."""
        return (self.row_count, len(self.columns))

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        return {name: c.bounds for name, c in self.columns.items()}


class Network:
    """A network's directory, and your logins to its members.

    Args:
        url: the network's address, e.g. ``"http://net.example.org:8000"``.
        transport: an httpx transport for the network (tests: an in-process app).
        timeout: seconds to wait for the network.
        busy_retries, retry_backoff: as for :class:`Client`: a ``503`` (too busy, nothing
            done) is asked again after its ``Retry-After`` or the backoff. A ``429`` (too
            many searches from your address lately) is not: it raises
            :class:`RateLimitedError`, whose ``retry_after`` says how long to wait.
    """

    def __init__(
        self,
        url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30.0,
        busy_retries: int = 5,
        retry_backoff: float = 0.5,
    ) -> None:
        self.url = node_url(url)
        self.busy_retries = busy_retries
        self.retry_backoff = retry_backoff
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX + "/network", transport=transport, timeout=timeout
        )
        #: your clients of its members, by node name
        self.clients: dict[str, Client] = {}

    def __repr__(self) -> str:
        return f"<dpnode Network {self.url}: logged in to {sorted(self.clients)}>"

    def _get(self, path: str, **params: Any) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.get(path, params=params)
            except httpx.TransportError as exc:
                raise NodeUnreachableError(
                    f"cannot reach the network at {self.url}: {exc}"
                ) from exc
            try:
                raise_for_error(response)
            except NodeBusyError as exc:  # a read: always safe to ask again
                if attempt >= self.busy_retries:
                    raise
                time.sleep(_busy_wait(exc.retry_after, self.retry_backoff, attempt))
                attempt += 1
                continue
            return response.json()

    def nodes(self) -> list[NodeInfo]:
        """The network's members, reachable or not."""
        return [
            NodeInfo(
                name=n["name"],
                url=n["url"],
                reachable=n["reachable"],
                last_seen_at=datetime.fromisoformat(n["last_seen_at"]),
                datasets=n["datasets"],
            )
            for n in self._get("/nodes")
        ]

    def login(
        self,
        node: str | Mapping[str, tuple[str, str]],
        *,
        email: str | None = None,
        password: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> Network:
        """Log in to one member (``login("site-a", email=..., password=...)``) or several
        (``login({"site-a": (email, password), ...})``), each with its own account there.

        Args:
            transport: an httpx transport for the node (tests: an in-process app).

        Raises:
            NotFoundError: the network lists no such node.
            AuthenticationError: the node refused the email or password.
            NodeUnreachableError: the network or the node does not answer.
        """
        if not isinstance(node, str):
            for name, (mail, secret) in node.items():
                self.login(name, email=mail, password=secret, transport=transport)
            return self
        if email is None or password is None:
            raise TypeError("give email= and password= (or a mapping {node: (email, password)})")
        members = {n.name: n for n in self.nodes()}
        if node not in members:
            known = ", ".join(sorted(members)) or "none"
            raise NotFoundError(f"the network {self.url} lists no node {node!r} (nodes: {known})")
        client = Client(members[node].url, transport=transport).login(email, password)
        client.name = node
        self.clients[node] = client
        return self

    def search(
        self, tags: Iterable[str] = (), text: str | None = None
    ) -> list[DatasetHandle | DatasetListing]:
        """Datasets of every reachable member carrying all of ``tags`` and matching ``text``:
        handles on the nodes you logged in to, listings on the others.

        Raises:
            NodeUnreachableError: the network (or a node you logged in to) does not answer.
            RateLimitedError: too many searches from your address lately (the network's
                limit); wait ``retry_after`` seconds.
        """
        tags = list(_tags(tags))
        params: dict[str, Any] = {"tags": tags}
        if text:
            params["text"] = text
        listed = self._get("/search", **params)["datasets"]
        handles: dict[str, dict[str, DatasetHandle]] = {}
        for name in {item["node"] for item in listed} & set(self.clients):
            client = self.clients[name]
            handles[name] = {d.name: d for d in client.datasets(tags=tags, text=text)}
        found: list[DatasetHandle | DatasetListing] = []
        for item in listed:
            d = item["dataset"]
            handle = handles.get(item["node"], {}).get(d["name"])
            found.append(handle if handle is not None else _listing(item))
        return found


def _listing(item: dict[str, Any]) -> DatasetListing:
    d = item["dataset"]
    return DatasetListing(
        name=d["name"],
        description=d["description"],
        tags=list(d["tags"]),
        row_count=d["row_count"],
        columns=columns_from_json(d["columns"]),
        subject_id=d["subject_id"],
        subject_count=d["subject_count"],
        has_mock=d["has_mock"],
        node=NodeRef(item["node"], item["node_url"]),
    )


_networks: dict[str, Network] = {}


def network(url: str, *, transport: httpx.BaseTransport | None = None) -> Network:
    """The network at ``url`` (the same object for the same address, so that
    ``sdk.search(network=url)`` sees your logins to its members)."""
    key = node_url(url)
    if key not in _networks or transport is not None:
        _networks[key] = Network(key, transport=transport)
    return _networks[key]
