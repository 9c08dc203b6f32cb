"""The client's discovery calls: search a node's datasets and models, and fetch one by id or
name (a network's search, across nodes, is ``dpnode.sdk._network``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from dpnode.sdk._client_uploads import _tags
from dpnode.sdk._handles import DatasetHandle, ModelHandle

if TYPE_CHECKING:
    from dpnode.sdk._client import Client


class SearchCalls:
    """:class:`~sdk.Client`'s discovery calls (a mixin: it sends through the client's requests)."""

    if TYPE_CHECKING:

        def _json(self, method: str, path: str, **kwargs: Any) -> Any: ...

        def _as_client(self) -> Client: ...

    def search(
        self,
        tags: Iterable[str] = (),
        text: str | None = None,
        kind: Literal["any", "dataset", "model"] = "any",
    ) -> list[DatasetHandle | ModelHandle]:
        """Datasets (first) and models carrying all of ``tags`` and matching ``text``."""
        params: dict[str, Any] = {"tags": list(_tags(tags)), "kind": kind}
        if text:
            params["text"] = text
        body = self._json("GET", "/search", params=params)
        found: list[DatasetHandle | ModelHandle] = [
            DatasetHandle.from_json(self._as_client(), d) for d in body["datasets"]
        ]
        found += [ModelHandle.from_json(self._as_client(), m) for m in body["models"]]
        return found

    def datasets(self, tags: Iterable[str] = (), text: str | None = None) -> list[DatasetHandle]:
        params: dict[str, Any] = {"tags": list(_tags(tags))}
        if text:
            params["text"] = text
        return [
            DatasetHandle.from_json(self._as_client(), d)
            for d in self._json("GET", "/datasets", params=params)
        ]

    def dataset(self, ref: int | str) -> DatasetHandle:
        """A dataset by id or name."""
        return DatasetHandle.from_json(self._as_client(), self._json("GET", f"/datasets/{ref}"))

    def models(self, tags: Iterable[str] = (), text: str | None = None) -> list[ModelHandle]:
        params: dict[str, Any] = {"tags": list(_tags(tags))}
        if text:
            params["text"] = text
        return [
            ModelHandle.from_json(self._as_client(), m)
            for m in self._json("GET", "/models", params=params)
        ]

    def model(self, ref: int | str) -> ModelHandle:
        """A model by id or name."""
        return ModelHandle.from_json(self._as_client(), self._json("GET", f"/models/{ref}"))
