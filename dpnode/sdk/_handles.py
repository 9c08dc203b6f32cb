"""What a search returns: handles on datasets and models, with their public metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy.typing as npt

from dpnode.sdk._caps import DatasetBudget
from dpnode.sdk._display import Columns, fields_table, records_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dpnode.sdk._client import Client
    from dpnode.sdk._groupby import Grouped
    from dpnode.sdk._remote import RemoteTensor
    from dpnode.sdk._synthesis import SynthesisJob
    from dpnode.sdk.query import Query, QueryResult


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


def columns_from_json(columns: list[dict[str, Any]]) -> dict[str, ColumnInfo]:
    """A dataset's columns as a node (or a network's directory) describes them, by name."""
    return {
        c["name"]: ColumnInfo(
            name=c["name"],
            dtype=c["dtype"],
            shape=tuple(c["shape"]),
            bounds=(c["bounds"][0], c["bounds"][1]),
            categories=tuple(c["categories"]) if c.get("categories") is not None else None,
        )
        for c in columns
    }


@dataclass(frozen=True)
class NodeRef:
    """The node a dataset lives on: its name (in a network's directory) and its address.

    >>> str(NodeRef("site-a", "https://site-a.example.org"))
    'site-a'
    """

    name: str
    url: str

    def __str__(self) -> str:
        return self.name


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
    #: a synthetic dataset's provenance (source, method, epsilon, delta, rows, ledger row)
    synthetic: dict[str, Any] | None = None
    #: the receipt of the synthesis that made this dataset (on the handle it returned)
    receipt: dict[str, Any] | None = field(default=None, repr=False)
    #: where the mock came from when the node synthesized it (method, epsilon, delta, rows,
    #: ledger row, when; paid from the dataset's cap); ``None`` for an uploaded mock
    mock_synthetic: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, client: Client, body: dict[str, Any]) -> DatasetHandle:
        return cls(
            id=body["id"],
            name=body["name"],
            description=body["description"],
            tags=list(body["tags"]),
            owner=body["owner"],
            row_count=body["row_count"],
            columns=columns_from_json(body["columns"]),
            subject_id=body["subject_id"],
            subject_count=body["subject_count"],
            has_mock=body["has_mock"],
            _client=client,
            synthetic=body.get("synthetic"),
            mock_synthetic=body.get("mock_synthetic"),
        )

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns)."""
        return (self.row_count, len(self.columns))

    @property
    def node(self) -> NodeRef:
        """The node this dataset lives on (named as its network lists it, else by address)."""
        return NodeRef(self._client.name or self._client.url, self._client.url)

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        return {name: c.bounds for name, c in self.columns.items()}

    def budget(self) -> DatasetBudget:
        """How much of this dataset's cap all users together have spent: used / cap under
        the policy in force (``capped`` false: the policy sets none).

        Raises:
            PermissionDeniedError: you are neither its owner nor an admin (the figure tells
                how much others queried the dataset; your own spending is ``client.budget()``).
        """
        return DatasetBudget.from_json(self._client._json("GET", f"/datasets/{self.id}/budget"))

    def mock(self) -> Columns:
        """The dataset's mock (fake) data, to dry-run code before spending budget: a dict of
        columns, in the dataset's order; ``.to_pandas()`` makes a DataFrame (categories as
        strings). ``.synthetic``
        is its provenance when the node synthesized it (:meth:`synthesize_mock`), else
        ``None``."""
        columns = self._client._download_frame(f"/datasets/{self.id}/mock")
        columns.categories = self._categories()
        return columns

    def _categories(self) -> dict[str, tuple[str, ...]]:
        return {n: c.categories for n, c in self.columns.items() if c.categories is not None}

    @overload
    def synthesize_mock(
        self,
        *,
        epsilon: float,
        delta: float,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        rows: int | None = None,
        idempotency_key: str | None = None,
        wait: Literal[True] = True,
        progress: bool | None = None,
    ) -> DatasetHandle: ...
    @overload
    def synthesize_mock(
        self,
        *,
        epsilon: float,
        delta: float,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        rows: int | None = None,
        idempotency_key: str | None = None,
        wait: Literal[False],
        progress: bool | None = None,
    ) -> SynthesisJob: ...
    def synthesize_mock(
        self,
        *,
        epsilon: float,
        delta: float,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        rows: int | None = None,
        idempotency_key: str | None = None,
        wait: bool = True,
        progress: bool | None = None,
    ) -> DatasetHandle | SynthesisJob:
        """Make this dataset's mock a differentially private synthetic table (its owner or
        an admin), paid from the dataset's cap, not from your budget: the same columns,
        dtypes and bounds as the data, with the relations between columns that a
        synthesis keeps (:meth:`synthesize`'s methods), for every data scientist's
        ``ds.mock()``. The policy must cap the dataset (``[datasets.NAME]``).

        Args: as :meth:`synthesize` (``rows``: mock rows, default the dataset's).

        Returns:
            This dataset's handle anew (``.mock_synthetic`` its mock's provenance,
            ``.receipt`` the charge and what is left of the cap), or with ``wait=False``
            the job.

        Raises:
            PermissionDeniedError: you neither own the dataset nor are an admin.
            PolicyRefusedError: the policy sets no cap on the dataset; nothing charged.
            BudgetExceededError: the mock does not fit what is left of the cap.
            DPNodeError, EvaluationError: as :meth:`synthesize`.
        """
        from dpnode.sdk._synthesis import start

        body = {"epsilon": epsilon, "delta": delta, "method": method, "bins": bins, "rows": rows}
        job = start(self._client, f"/datasets/{self.id}/mock/synthesize", body, idempotency_key)
        return job.wait(progress=progress) if wait else job

    def __getitem__(self, column: str) -> RemoteTensor:
        """One column as a remote tensor of shape ``(rows, *per-row shape)``; no values travel.

        Inside ``sdk.mock(ds)`` the tensor is shaped like the mock data instead.
        Categorical columns are int64 category indices, boolean columns bool.

        Raises:
            KeyError: no such column (the message lists the columns).
        """
        from dpnode.sdk._remote.handles import column_tensor

        return column_tensor(self, column)

    @property
    def subjects(self) -> RemoteTensor:
        """Which rows belong to one data subject: int64 ``(rows,)``, rows of one subject equal.

        Public structure, not the subject ids themselves: each row is labelled by the
        first row of its subject. Pass it (or its rows of a batch, ``ds.subjects[idx]``)
        as ``publish_grads(..., subjects=...)`` so a subject's rows are clipped together.
        Inside ``sdk.mock(ds)`` it is shaped like the mock data instead.
        """
        from dpnode.sdk._remote.handles import subjects_tensor

        return subjects_tensor(self)

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
        from dpnode.sdk._remote.handles import dataset_tensors

        return dataset_tensors(self, columns, stack)

    def groupby(self, column: str | list[str], categories: Any = None) -> Grouped:
        """Statistics per group of one or more public keys, each released in one publish:
        ``ds.groupby("sex").mean("bmi", epsilon=1.0)``, ``ds.groupby(["education", "sex"])``
        (also ``count``, ``sum``, ``var``, ``std``, ``median``, ``quantile``, ``min``,
        ``max``, ``agg``). A face on :meth:`query`, which does more.

        The groups are a categorical column's categories, the integers of an integer
        column's bounds, or ``categories`` (one key column). See ``dpnode/sdk/_groupby.py``.

        Raises:
            KeyError: no such column.
            DPNodeError: a column without public groups (pass ``categories=``).
        """
        from dpnode.sdk._groupby import Grouped

        return Grouped(self, column, categories)

    def query(self) -> Query:
        """A query on this dataset's rows: ``ds.query().filter(col("age") > 30)
        .group_by("sex").agg(count(), mean("bmi")).publish(epsilon=1.0)``.

        See ``dpnode.sdk.query`` and docs/statistics.md.
        """
        from dpnode.sdk.query import Query

        return Query(self)

    def describe(
        self,
        *,
        epsilon: float,
        delta: float | None = None,
        columns: Sequence[str] | None = None,
    ) -> QueryResult:
        """count, mean, std, min, 25%, 50%, 75% and max of every numeric column with finite
        bounds (or of ``columns``), like pandas' ``describe``, in two publishes (one noised,
        one selected). The budget is shared by the columns described: name only those you
        want, and each gets more of it.

        Raises:
            QueryError: no numeric column with finite bounds, a column in ``columns`` that
                is not one, or a bad epsilon.
        """
        from dpnode.sdk.query.describe import describe

        return describe(self, epsilon=epsilon, delta=delta, columns=columns)

    def download(self) -> Columns:
        """The stored values — for the dataset's owner and admins; for data scientists only
        the synthetic datasets they made (:meth:`synthesize`). ``.to_pandas()``,
        ``.to_polars()``, ``.to_arrow()`` make frames, categories as strings.

        Raises:
            PermissionDeniedError: a data scientist asking for real values.
        """
        columns = self._client._download_frame(f"/datasets/{self.id}/data")
        columns.categories = self._categories()
        return columns

    @overload
    def synthesize(
        self,
        *,
        epsilon: float,
        delta: float,
        rows: int | None = None,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        columns: list[str] | None = None,
        name: str | None = None,
        seed: int | None = None,
        idempotency_key: str | None = None,
        wait: Literal[True] = True,
        progress: bool | None = None,
    ) -> DatasetHandle: ...
    @overload
    def synthesize(
        self,
        *,
        epsilon: float,
        delta: float,
        rows: int | None = None,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        columns: list[str] | None = None,
        name: str | None = None,
        seed: int | None = None,
        idempotency_key: str | None = None,
        wait: Literal[False],
        progress: bool | None = None,
    ) -> SynthesisJob: ...
    def synthesize(
        self,
        *,
        epsilon: float,
        delta: float,
        rows: int | None = None,
        method: str = "mst",
        bins: dict[str, int] | None = None,
        columns: list[str] | None = None,
        name: str | None = None,
        seed: int | None = None,
        idempotency_key: str | None = None,
        wait: bool = True,
        progress: bool | None = None,
    ) -> DatasetHandle | SynthesisJob:
        """A differentially private synthetic copy of this dataset, made on the node (MST or
        AIM: noisy marginals, Private-PGM's estimate) and paid from your budget as one
        ledger row: a new dataset you own, with the same columns and bounds, that you
        may download (``.download().to_pandas()``) and explore freely.

        The node charges the run at once, then computes it as a job; this waits for it with
        a progress bar (rounds and phase; shown in a terminal or a notebook unless
        ``progress`` says otherwise), or with ``wait=False`` returns the
        :class:`~dpnode.sdk.SynthesisJob` (``.status()``, ``.wait()``, ``.result()``).

        Args:
            epsilon, delta: the whole run's privacy (delta > 0: the marginals are measured
                with Gaussian noise).
            rows: rows to sample (default: as many as this dataset has).
            method: ``"mst"`` or ``"aim"`` (rounds that measure the marginals the model
                gets worst, up to 3-way; slower, charged once at a bound on every run).
            bins: bins of numeric columns, by name (default: from the row count, at most 32).
            columns: the columns to copy (default: all).
            name: the new dataset's name (default: this one's with a suffix).
            seed: seeds the sampling of rows from the model (never the noise); not stored.
            idempotency_key: names the request (default: a fresh one), so that the SDK's
                retries, or yours with the same key, get the first answer (the same job),
                charged once.
            wait: wait for the result (default), or return the job.
            progress: show the bar (default: the client's setting).

        Returns:
            The new dataset's handle (or, with ``wait=False``, the job); ``.receipt`` says
            what was charged and, at no extra cost, which column sets were measured with
            what noise, the rounds and the domain size; ``.synthetic`` its provenance (the
            same report).

        Raises:
            BudgetExceededError, PolicyRefusedError, ApprovalRequiredError: refused by the
                budget or the policy; nothing charged.
            DPNodeError: a bad argument, several rows per subject, or a domain beyond the
                node's memory quota (``quota_exceeded``); nothing charged.
            EvaluationError: the job failed after its charge (which stands), with the reason.
        """
        from dpnode.sdk._synthesis import start

        body = {
            "epsilon": epsilon,
            "delta": delta,
            "rows": rows,
            "method": method,
            "bins": bins,
            "columns": columns,
            "name": name,
            "seed": seed,
        }
        job = start(self._client, f"/datasets/{self.id}/synthesize", body, idempotency_key)
        return job.wait(progress=progress) if wait else job

    def delete(self) -> None:
        self._client.delete_dataset(self.id)

    def __repr__(self) -> str:
        subjects = (
            f", {self.subject_count} subjects by {self.subject_id!r}" if self.subject_id else ""
        )
        synthetic = (
            f", synthetic from {self.synthetic.get('source')!r} "
            f"({self.synthetic.get('method')}, epsilon {self.synthetic.get('epsilon')})"
            if self.synthetic
            else ""
        )
        lines = [
            f"<Dataset {self.name!r} tags={self.tags} shape={self.shape}{subjects}"
            + (", mock available" if self.has_mock else "")
            + (f" ({_mock_words(self.mock_synthetic)})" if self.mock_synthetic else "")
            + synthetic
        ]
        width = max((len(n) for n in self.columns), default=0)
        lines += [f"  {n:<{width}}  {c.describe()}" for n, c in self.columns.items()]
        return "\n".join(lines) + ">"

    def _repr_html_(self) -> str:
        summary = fields_table(
            f"dataset {self.name!r}",
            [
                ("id", self.id),
                ("description", self.description),
                ("tags", self.tags),
                ("owner", self.owner),
                ("shape", str(self.shape)),
                (
                    "subjects",
                    f"{self.subject_count} by {self.subject_id!r}"
                    if self.subject_id
                    else "one a row",
                ),
                (
                    "mock data",
                    ("available" if self.has_mock else "none")
                    + (f" ({_mock_words(self.mock_synthetic)})" if self.mock_synthetic else ""),
                ),
            ],
        )
        rows = [(c.name, c.dtype, c.shape, c.bounds, c.categories) for c in self.columns.values()]
        columns = records_table(
            "columns", ["name", "dtype", "row shape", "bounds", "categories"], rows
        )
        return summary + columns


def _mock_words(provenance: dict[str, Any]) -> str:
    """A synthetic mock in a few words.

    >>> _mock_words({"method": "mst", "epsilon": 1.0, "delta": 1e-06})
    'synthetic: mst, epsilon 1, delta 1e-06'
    """
    return (
        f"synthetic: {provenance.get('method')}, epsilon {provenance.get('epsilon'):g}, "
        f"delta {provenance.get('delta'):g}"
    )


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
        from dpnode.sdk._remote.handles import model_state

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
