"""Prims without a privacy rule are refused on private data as the op is recorded.

The node refuses to publish anything that applies a public-only prim to private data;
the SDK refuses it as the torch call is recorded, naming that call (``torch.median`` along
a dim, not the ``argsort`` it decomposes into), in mock mode exactly as against the node, and
from public metadata only. The same calls on public values record and evaluate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk
from dpnode.core.engine import REGISTRY
from dpnode.sdk._remote import evaluate, remote_input
from tests.sdk.conftest import cohort, remote_dataset

#: (the call a refusal names, the prim it needs, the op on a 1-d float vector v and a
#: matrix M, both private or both public)
Case = tuple[str, str, Callable[[torch.Tensor, torch.Tensor], Any]]
CASES: list[Case] = [
    ("torch.median", "argsort", lambda v, M: torch.median(M, dim=0).values),
    ("Tensor.median", "argsort", lambda v, M: M.median(1).values),
    ("torch.sort", "argsort", lambda v, M: torch.sort(v).values),
    ("torch.cumsum", "cumsum", lambda v, M: torch.cumsum(v, 0)),
    ("Tensor.cumsum_", "cumsum", lambda v, M: v.clone().cumsum_(0)),
    ("torch.linalg.cholesky", "cholesky", lambda v, M: torch.linalg.cholesky(M)),
    (
        "torch.special.chebyshev_polynomial_t",
        "chebyshev_polynomial_t",
        lambda v, M: torch.special.chebyshev_polynomial_t(v, 3),
    ),
]
IDS = [c[0] for c in CASES]


def _private(ds: sdk.DatasetHandle) -> tuple[torch.Tensor, torch.Tensor]:
    """A private vector (bmi) and a private positive-definite matrix built from the data."""
    X = ds.tensors("age", "bmi") / torch.tensor([120.0, 70.0])
    return ds["bmi"], X.T @ X + torch.eye(2)


def _refusal(ds: sdk.DatasetHandle, fn: Callable[..., Any]) -> sdk.NotPublishableError:
    v, M = _private(ds)
    with pytest.raises(sdk.NotPublishableError) as info:
        fn(v, M)
    return info.value


@pytest.mark.usefixtures("sqlite_only")
@pytest.mark.parametrize(("call", "prim", "fn"), CASES, ids=IDS)
def test_a_public_only_op_on_private_data_is_refused_as_it_is_recorded(
    owner_client: sdk.Client, ds_client: sdk.Client, call: str, prim: str, fn: Any
) -> None:
    assert REGISTRY[prim].privacy == "public_only"
    ds = remote_dataset(owner_client, ds_client)
    error = _refusal(ds, fn)
    assert str(error).startswith(
        f"{call} on private data cannot be published: it needs prim {prim!r}, "
        "which has no privacy rule"
    ), str(error)
    assert (error.call, error.prim, error.code) == (call, prim, "not_publishable")
    # a privacy refusal, caught by code written for the node's (PrivacyTrackingError)
    assert isinstance(error, sdk.PrivacyTrackingError) and isinstance(error, sdk.DPNodeError)
    assert "docs/prims.md" in str(error)
    # mock mode refuses the same op with the same words
    with sdk.mock(ds):
        assert str(_refusal(ds, fn)) == str(error)


@pytest.mark.usefixtures("sqlite_only")
def test_a_refusal_suggests_an_alternative_that_records_and_publishes(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    bmi = ds["bmi"]
    n = bmi.shape[0]
    assert "x @ torch.ones(n, n).triu()" in str(_refusal(ds, CASES[3][2]))
    assert "(x <= t).float().mean()" in str(_refusal(ds, CASES[0][2]))
    assert "publish the matrix" in str(_refusal(ds, CASES[5][2]))
    with pytest.raises(sdk.NotPublishableError, match=r"^torch\.histc .*one comparison per bin"):
        torch.histc(bmi, bins=4)  # the data's own range: private edges
    # the alternatives are accepted by the node: their sensitivity is bounded
    edges = torch.linspace(10, 70, 5)
    column = bmi.unsqueeze(-1)
    alternatives = [
        bmi @ torch.ones(n, n).triu(),
        (bmi <= 30).float().mean(),
        ((column >= edges[:-1]) & (column < edges[1:])).sum(0),
    ]
    for t in alternatives:
        assert 0 < t.sensitivity().l1 < float("inf")
    with sdk.mock(ds) as m:
        v = torch.from_numpy(ds.mock()["bmi"])
        torch.testing.assert_close(m.evaluate(ds["bmi"] @ torch.ones(30, 30).triu()), v.cumsum(0))


@pytest.mark.usefixtures("sqlite_only")
def test_the_same_ops_on_public_data_record_and_evaluate(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    rng = np.random.default_rng(3)
    A = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
    weights = {
        "v": rng.uniform(-1, 1, 9).astype(np.float32),
        "M": (A @ A.T + 3 * np.eye(3)).astype(np.float32),
    }
    owner_client.upload_model("public-weights", weights, tags=["demo"], public=True)
    model = ds_client.model("public-weights")
    local = {k: torch.from_numpy(w) for k, w in model.weights().items()}
    state = model.state_dict()  # a public model's weights are public remote tensors
    outs = [fn(state["v"], state["M"]) for _, _, fn in CASES]
    assert all(isinstance(t, sdk.RemoteTensor) for t in outs)
    # the node agrees: nothing private, so nothing for one subject to move
    assert outs[0].sensitivity().l1 == 0
    with sdk.mock(model) as m:
        state = model.state_dict()
        for (call, _, fn), got in zip(
            CASES, m.evaluate(*(fn(state["v"], state["M"]) for _, _, fn in CASES)), strict=True
        ):
            torch.testing.assert_close(got, fn(local["v"], local["M"]), msg=call)
    # and on remote inputs that name no dataset column: the subject grouping, any other name
    assert torch.sort(ds.subjects).values.shape == (40,)
    x = remote_input("x", (9,), torch.float32)
    (got,) = evaluate([torch.cumsum(x, 0)], {"x": weights["v"]})
    torch.testing.assert_close(got, torch.from_numpy(weights["v"]).cumsum(0))
    # a public-only op's public result may then meet private data
    assert isinstance(torch.median(state["v"]) * ds["bmi"], sdk.RemoteTensor)


@pytest.mark.usefixtures("sqlite_only")
@pytest.mark.parametrize(("call", "prim", "fn"), CASES, ids=IDS)
def test_a_refusal_depends_on_public_metadata_only(
    owner_client: sdk.Client, ds_client: sdk.Client, call: str, prim: str, fn: Any
) -> None:
    # two datasets with the same contract and shapes, very different values, and a mock
    # of yet other values: the same exception, word for word
    contract = {"age": (0, 120), "bmi": (10, 70), "sex": (0, 1), "scan": (0, 1)}
    skewed = cohort(40, 9)
    skewed["bmi"] = np.full(40, 10.0, dtype=np.float32)
    skewed["age"] = np.zeros(40, dtype=np.int64)
    messages = set()
    for name, data in (("first", cohort(40, 0)), ("second", skewed)):
        owner_client.upload_dataset(name, data, bounds=contract, mock=cohort(30, 1))
        ds = ds_client.dataset(name)
        for mocked in (False, True):
            with sdk.mock(ds) if mocked else contextlib.nullcontext():
                error = _refusal(ds, fn)
                messages.add((type(error), str(error), error.call, error.prim))
    assert len(messages) == 1


@pytest.mark.usefixtures("sqlite_only")
def test_a_gradient_that_needs_a_public_only_prim_names_the_backward_call(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    # a lookup has a privacy rule, and so has its gradient as one-hot codes, but not when
    # it is scaled by how often each id occurs (a count of private values)
    embedding = torch.nn.Embedding(2, 3, scale_grad_by_freq=True)
    loss = embedding(ds["sex"]).sum()
    for run, call in [
        (lambda: loss.backward(retain_graph=True), "Tensor.backward()"),
        (lambda: torch.autograd.grad(loss, [embedding.weight]), "torch.autograd.grad"),
    ]:
        with pytest.raises(sdk.NotPublishableError) as info:
            run()
        assert str(info.value).startswith(
            f"{call} on private data cannot be published: the gradient through "
            "EmbeddingBackward0 needs prim 'index_put', which has no privacy rule"
        ), str(info.value)
        assert info.value.call == call


@pytest.mark.usefixtures("sqlite_only")
def test_ordinary_training_and_view_writes_still_record(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    X = ds.tensors("age", "bmi") / torch.tensor([120.0, 70.0])
    y = ds["diabetic"].float()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    F.binary_cross_entropy_with_logits(model(X).squeeze(1), y).backward()
    for p in model.parameters():
        assert isinstance(p.grad, sdk.RemoteTensor) and p.grad.node.private
        assert 0 < p.grad.sensitivity().l1 < float("inf")
    # writes through views of private data are recorded with prims that have privacy rules
    x = ds.tensors("age", "bmi").clone()
    x[:, 0].clamp_(max=90)
    x[::3, 1] = 0.0
    x[1:30:4] *= 2
    assert {n.op for n in x.graph().nodes} - {"input", "constant"} <= {
        name for name, d in REGISTRY.items() if d.privacy == "rule"
    }
    assert 0 < x.sensitivity().l1 < float("inf")
    with sdk.mock(ds) as m:
        x = ds.tensors("age", "bmi").clone()
        x[:, 0].clamp_(max=90)
        x[::3, 1] = 0.0
        x[1:30:4] *= 2
        fake = ds.mock()
        want = torch.stack(
            [torch.from_numpy(fake["age"]).float(), torch.from_numpy(fake["bmi"])], 1
        )
        want[:, 0].clamp_(max=90)
        want[::3, 1] = 0.0
        want[1:30:4] *= 2
        torch.testing.assert_close(m.evaluate(x), want)
