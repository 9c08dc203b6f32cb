"""What travels between a network and its members, and what the network answers searches with.

Everything a member sends is JSON read into these strict models (no coercion of types, no
unknown fields, every string and list bounded), so a catalog is data the network stores and
lists, never code. The catalog holds a dataset's public metadata only: the fields the node's
own search answers (``dpnode.node.api.routes.datasets.dataset_public``) less the owner's
account, which no network keeps.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

#: the tags a node accepts (dpnode.node.services.catalog.normalise_tags)
Tag = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.:+-]{0,63}$")]
ItemName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
#: a member's name in the directory: what ``net.login(name, ...)`` is given
NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")]
NodeUrl = Annotated[
    str, StringConstraints(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=300)
]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0, le=2**62)]

CREDENTIAL_PREFIX = "dpm_"
TOKEN_PREFIX = "dpj_"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, from_attributes=True)


class CatalogColumn(Strict):
    name: ItemName
    dtype: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,16}$")]
    shape: list[Annotated[int, Field(ge=0, le=2**40)]] = Field(max_length=8)
    bounds: tuple[
        Annotated[float, Field(allow_inf_nan=False)], Annotated[float, Field(allow_inf_nan=False)]
    ]
    categories: list[Annotated[str, StringConstraints(max_length=200)]] | None = Field(
        default=None, max_length=10_000
    )


class CatalogDataset(Strict):
    """One dataset of a member's public catalog."""

    id: Count
    name: ItemName
    description: Annotated[str, StringConstraints(max_length=4000)] = ""
    tags: list[Tag] = Field(default_factory=list, max_length=50)
    row_count: Count
    columns: list[CatalogColumn]
    subject_id: ItemName | None = None
    subject_count: Count
    has_mock: bool = False


class Catalog(Strict):
    """A member's public catalog (sizes bounded further by the network's settings)."""

    datasets: list[CatalogDataset]


def catalog_digest(catalog: Catalog) -> str:
    """The sha256 of a catalog's canonical JSON: a heartbeat carries it, so the catalog
    itself travels only when it changed.

    >>> catalog_digest(Catalog(datasets=[])) == catalog_digest(Catalog(datasets=[]))
    True
    """
    text = json.dumps(catalog.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class JoinRequest(Strict):
    token: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    name: NodeName
    url: NodeUrl
    catalog: Catalog


class JoinAnswer(Strict):
    member_id: int
    name: str
    credential: str = Field(description="sent as a bearer token by the member from now on")
    unreachable_after_seconds: float = Field(
        description="a member silent this long is unreachable and left out of searches"
    )


class Heartbeat(Strict):
    catalog_digest: Digest


class HeartbeatAnswer(Strict):
    catalog_digest: str = Field(description="the digest of the catalog the network holds")


class JoinTokenCreate(Strict):
    note: Annotated[str, StringConstraints(max_length=200)] = ""


class JoinTokenPublic(Strict):
    id: int
    note: str
    created_at: datetime
    created_by: str
    expires_at: datetime
    revoked_at: datetime | None
    used_at: datetime | None
    used_by: str | None


class JoinTokenIssued(JoinTokenPublic):
    token: str = Field(description="shown once: the network keeps only its digest")


class NodePublic(Strict):
    """A member as anyone may see it: where it is and whether it answers."""

    name: str
    url: str
    reachable: bool
    last_seen_at: datetime
    datasets: int


class MemberPublic(NodePublic):
    """A member as the network's admin sees it."""

    id: int
    joined_at: datetime
    catalog_updated_at: datetime | None


class Listing(Strict):
    """A dataset found on the network, with the node it lives on."""

    node: str
    node_url: str
    dataset: CatalogDataset


class NetworkSearchResults(Strict):
    datasets: list[Listing]
