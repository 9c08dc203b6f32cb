"""What a search returns: handles on datasets and models, with their public metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

if TYPE_CHECKING:
    from sdk._client import Client
    from sdk._groupby import Grouped
    from sdk._remote import RemoteTensor


@dataclass(frozen=True)
class ColumnInfo:
    """Public facts about one column: dtype, per-row shape, declared bounds, categories."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bounds: tuple[float, float]
    categories: tuple[str, ...] | None = None

    def describe(self) -> str:
        shape = f" {self.shape}" if self.shape else ""
        if self.categories is not None:
            shown = ", ".join(self.categories[:6]) + (", ..." if len(self.categories) > 6 else "")
            return f"{self.dtype}{shape} categories [{shown}]"
        low, high = self.bounds
        return f"{self.dtype}{shape} in [{low:g}, {high:g}]"


@dataclass(frozen=True)
class User:
    id: int
    email: str
    role: str
    is_active: bool
    created_at: datetime


@dataclass(frozen=True)
class AuditEvent:
    id: int
    at: datetime
    actor_email: str | None
    action: str
    target_type: str | None
    target_id: int | None
    detail: dict[str, Any]


@dataclass(eq=False)
class DatasetHandle:
    """A dataset on the node. Its values never come here; its metadata is public."""

    id: int
    name: str
    description: str
    tags: list[str]
    owner: str
    row_count: int
    columns: dict[str, ColumnInfo]
    subject_id: str | None
    subject_count: int
    has_mock: bool
    _client: Client = field(repr=False)

    @classmethod
    def from_json(cls, client: Client, body: dict[str, Any]) -> DatasetHandle:
        return cls(
            id=body["id"],
            name=body["name"],
            description=body["description"],
            tags=list(body["tags"]),
            owner=body["owner"],
            row_count=body["row_count"],
            columns={
                c["name"]: ColumnInfo(
                    name=c["name"],
                    dtype=c["dtype"],
                    shape=tuple(c["shape"]),
                    bounds=(c["bounds"][0], c["bounds"][1]),
                    categories=tuple(c["categories"]) if c["categories"] is not None else None,
                )
                for c in body["columns"]
            },
            subject_id=body["subject_id"],
            subject_count=body["subject_count"],
            has_mock=body["has_mock"],
            _client=client,
        )

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns)."""
        return (self.row_count, len(self.columns))

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        return {name: c.bounds for name, c in self.columns.items()}

    def mock(self) -> dict[str, npt.NDArray[Any]]:
        """The dataset's mock (fake) data, to dry-run code before spending budget."""
        return self._client._download_frame(f"/datasets/{self.id}/mock")

    def __getitem__(self, column: str) -> RemoteTensor:
        """One column as a remote tensor of shape ``(rows, *per-row shape)``; no values travel.

        Inside ``sdk.mock(ds)`` the tensor is shaped like the mock data instead.
        Categorical columns are int64 category indices, boolean columns bool.

        Raises:
            KeyError: no such column (the message lists the columns).
        """
        from sdk._remote.handles import column_tensor

        return column_tensor(self, column)

    @property
    def subjects(self) -> RemoteTensor:
        """Which rows belong to one data subject: int64 ``(rows,)``, rows of one subject equal.

        Public structure, not the subject ids themselves: each row is labelled by the
        first row of its subject. Pass it (or its rows of a batch, ``ds.subjects[idx]``)
        as ``publish_grads(..., subjects=...)`` so a subject's rows are clipped together.
        """
        import torch

        from sdk._remote import remote_input

        return remote_input(
            f"dataset:{self.id}/@subject", (self.row_count,), torch.int64, origin=self._client
        )

    def tensors(self, *columns: str | list[str], stack: bool | None = None) -> Any:
        """Several columns at once, as remote tensors.

        - A list of column names gives one float feature matrix ``(rows, k)``: the
          columns promoted together (ints and bools to float32) and concatenated,
          a column with a per-row shape contributing its flattened width.
        - ``stack=True`` treats all ``columns`` as one such list; ``stack=False``
          returns one tensor per argument. The default stacks when every column is
          a per-row scalar (``ds.tensors("age", "bmi")`` is ``(rows, 2)``) and
          otherwise returns a tuple (``X, y = ds.tensors("features", "label")``).

        >>> X, y = ds.tensors(["age", "bmi"], "diabetic")  # doctest: +SKIP
        """
        from sdk._remote.handles import dataset_tensors

        return dataset_tensors(self, columns, stack)

    def groupby(self, column: str, categories: Any = None) -> Grouped:
        """Statistics per group of a public key, each released in one publish:
        ``ds.groupby("sex").mean("bmi", epsilon=1.0)`` (also ``count`` and ``sum``).

        The groups are a categorical column's categories, the integers of an integer
        column's bounds, or ``categories``. See ``sdk/_groupby.py``.

        Raises:
            KeyError: no such column.
            DPNodeError: a column without public groups (pass ``categories=``).
        """
        from sdk._groupby import Grouped

        return Grouped(self, column, categories)

    def download(self) -> dict[str, npt.NDArray[Any]]:
        """Real values — only for the dataset's owner and admins.

        Raises:
            PermissionDeniedError: for data scientists, always.
        """
        return self._client._download_frame(f"/datasets/{self.id}/data")

    def delete(self) -> None:
        self._client.delete_dataset(self.id)

    def __repr__(self) -> str:
        subjects = (
            f", {self.subject_count} subjects by {self.subject_id!r}" if self.subject_id else ""
        )
        lines = [
            f"<Dataset {self.name!r} tags={self.tags} shape={self.shape}{subjects}"
            + (", mock available" if self.has_mock else "")
        ]
        width = max((len(n) for n in self.columns), default=0)
        lines += [f"  {n:<{width}}  {c.describe()}" for n, c in self.columns.items()]
        return "\n".join(lines) + ">"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(eq=False)
class ModelHandle:
    """A model on the node: named weight tensors, public or private."""

    id: int
    name: str
    description: str
    tags: list[str]
    owner: str
    public: bool
    tensors: dict[str, TensorInfo]
    architecture_filename: str | None
    _client: Client = field(repr=False)

    @classmethod
    def from_json(cls, client: Client, body: dict[str, Any]) -> ModelHandle:
        return cls(
            id=body["id"],
            name=body["name"],
            description=body["description"],
            tags=list(body["tags"]),
            owner=body["owner"],
            public=body["public"],
            tensors={
                t["name"]: TensorInfo(t["name"], t["dtype"], tuple(t["shape"]))
                for t in body["tensors"]
            },
            architecture_filename=body["architecture_filename"],
            _client=client,
        )

    def state_dict(self) -> dict[str, RemoteTensor]:
        """Every weight as a remote tensor (``model:<id>/<name>`` inputs), for ``load_state_dict``.

        The values stay on the node even for a public model: computations that mix
        them with datasets are recorded into one graph. Inside ``sdk.mock(model)``
        (public or your own models) they evaluate on the downloaded weights.
        """
        from sdk._remote.handles import model_state

        return model_state(self)

    def weights(self) -> dict[str, npt.NDArray[Any]]:
        """The weights of a public model (or of your own)."""
        return self._client._download_frame(f"/models/{self.id}/weights")

    def architecture(self) -> bytes:
        """The architecture file as uploaded; dpnode never runs it, and neither should you
        unless you trust its owner."""
        return self._client._request("GET", f"/models/{self.id}/architecture").content

    def delete(self) -> None:
        self._client.delete_model(self.id)

    def __repr__(self) -> str:
        visibility = "public" if self.public else "private"
        lines = [f"<Model {self.name!r} tags={self.tags} {visibility}, {len(self.tensors)} tensors"]
        width = max((len(n) for n in self.tensors), default=0)
        lines += [f"  {n:<{width}}  {t.dtype} {t.shape}" for n, t in self.tensors.items()]
        return "\n".join(lines) + ">"
