"""Per-example gradients recorded on remote tensors, clipped by the node's prim, vs torch.func.

The reference is plain torch: ``vmap(grad(loss of one example))`` on local tensors, each
example's gradient (all parameters together) clipped to norm C, then summed. The remote
side is what ``sdk.publish_grads(..., max_grad_norm=C)`` sends, evaluated locally by the
node's engine on the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from dpnode import sdk
from dpnode.core.engine import plan
from dpnode.core.privacy import InputSpec, PrivacyReport, Subjects, track
from dpnode.core.privacy import tracker as tracker_module
from dpnode.sdk import _per_sample as per_sample
from dpnode.sdk._remote import evaluate, graph_for, remote_input
from tests.privacy.helpers import Column, assert_sound, neighbours

C = 0.5


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(515)


def _reference(
    model: torch.nn.Module,
    loss_one: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-subject clipped sum of per-example gradients, in plain torch."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return loss_one(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    g = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g[k].reshape(x.shape[0], -1) for k in params], dim=1).double()
    if groups is not None:
        uniq, inv = torch.unique(groups, return_inverse=True)
        flat = torch.zeros(len(uniq), flat.shape[1], dtype=flat.dtype).index_add_(0, inv, flat)
    norms = flat.norm(dim=1, keepdim=True)
    return (flat * torch.clamp(C / norms, max=1.0)).sum(dim=0)


def _remote_clipped(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    *,
    rows: int,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    params = [p for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    samples = per_sample.per_example_grads(params, names)
    total = per_sample.clipped_sum(samples, max_norm=C, groups=groups, scale=float(rows))
    (value,) = evaluate([total], inputs)
    return value.double()


def _assert_tracked_at_2c_and_sound(
    model: torch.nn.Module, cols: dict[str, Column], rng: np.random.Generator, rounds: int
) -> PrivacyReport:
    """The graph publish_grads sends after ``model``'s backward pass: the node tracks it at
    exactly 2C (plus rounding), and neighbours at the bounds stay within what it tracked."""
    n = next(iter(cols.values())).shape[0]
    samples = per_sample.per_example_grads(
        list(model.parameters()), [k for k, _ in model.named_parameters()]
    )
    graph = graph_for([per_sample.clipped_sum(samples, max_norm=C, scale=float(n))])
    report = track(graph, {name: col.spec() for name, col in cols.items()})
    assert report.outputs[0].exact_l2 == 2 * C
    for _ in range(rounds):
        assert_sound(graph, report, *neighbours(cols, rng))
    return report


def _data(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    y = (rng.uniform(0, 1, shape[0]) < 0.5).astype(np.float32)
    return x, y


def test_logistic_regression_matches_torch_func(rng: np.random.Generator) -> None:
    n, d = 32, 5
    x, y = _data(rng, (n, d))
    torch.manual_seed(0)
    model = torch.nn.Linear(d, 1)
    with torch.no_grad():
        model.weight.mul_(4)  # big gradients: most rows are clipped
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.float32)
    F.binary_cross_entropy_with_logits(model(X).squeeze(1), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out.squeeze(1), t)

    want = _reference(model, loss, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got.norm() <= n * C


def test_mlp_with_rows_grouped_by_subject_matches_torch_func(rng: np.random.Generator) -> None:
    n, d = 24, 4
    x, y = _data(rng, (n, d))
    groups = torch.from_numpy(rng.integers(0, 8, n))
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(d, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.float32)
    F.mse_loss(model(X).squeeze(1), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n, groups=groups)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.squeeze(1), t)

    want = _reference(model, loss, torch.from_numpy(x), torch.from_numpy(y), groups)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_middle_dims_are_summed_per_example(rng: np.random.Generator) -> None:
    """A Linear over [n, t, d] (a sequence per example): gradients summed over t."""
    n, t, d = 10, 3, 4
    x = rng.uniform(-1, 1, (n, t, d)).astype(np.float32)
    y = rng.uniform(-1, 1, n).astype(np.float32)
    torch.manual_seed(2)
    model = torch.nn.Linear(d, 2)
    X, Y = remote_input("X", (n, t, d), torch.float32), remote_input("y", (n,), torch.float32)
    F.mse_loss(model(X).sum(dim=(1, 2)), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.sum(dim=(1, 2)), target)

    want = _reference(model, loss, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_accumulation_follows_grad(rng: np.random.Generator) -> None:
    n, d = 8, 3
    x, y = _data(rng, (n, d))
    model = torch.nn.Linear(d, 1)
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.float32)

    def step() -> None:
        F.binary_cross_entropy_with_logits(model(X).squeeze(1), Y, reduction="sum").backward()

    def samples() -> list[torch.Tensor]:
        names = [k for k, _ in model.named_parameters()]
        got = per_sample.per_example_grads(list(model.parameters()), names)
        return evaluate(got, {"X": x, "y": y})

    step()
    once = samples()
    step()  # accumulates into .grad: the per-example gradients add up too
    for a, b in zip(samples(), once, strict=True):
        torch.testing.assert_close(a, 2 * b)
    grads = evaluate([p.grad for p in model.parameters()], {"X": x, "y": y})  # type: ignore[misc]
    for s, g in zip(samples(), grads, strict=True):
        torch.testing.assert_close(s.sum(dim=0), g, rtol=1e-5, atol=1e-5)
    model.zero_grad()  # set_to_none: the next backward starts afresh
    step()
    for a, b in zip(samples(), once, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        model.weight.grad.mul_(2)  # type: ignore[union-attr]  # changed by hand: refused
    with pytest.raises(sdk.DPNodeError, match=r"'weight'.*changed after the backward"):
        sdk.publish_grads(model, epsilon=1.0, delta=1e-6, max_grad_norm=C)


def test_parameters_outside_linear_layers_are_named(rng: np.random.Generator) -> None:
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)
            self.gain = torch.nn.Parameter(torch.ones(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.gain

    model = Scaled()
    X = remote_input("X", (5, 3), torch.float32)
    model(X).sum().backward()
    with pytest.raises(sdk.DPNodeError, match="'gain': its gradient does not come from"):
        sdk.publish_grads(model, epsilon=1.0, delta=1e-6, max_grad_norm=C)


def test_bad_arguments_are_refused_before_any_request() -> None:
    model = torch.nn.Linear(3, 1)
    model(remote_input("X", (5, 3), torch.float32)).sum().backward()
    with pytest.raises(sdk.DPNodeError, match="pass delta="):
        sdk.publish_grads(model, epsilon=1.0, max_grad_norm=C)
    with pytest.raises(sdk.DPNodeError, match="max_grad_norm must be"):
        sdk.publish_grads(model, epsilon=1.0, delta=1e-6, max_grad_norm=0.0)
    with pytest.raises(sdk.DPNodeError, match="integer tensor of shape"):
        sdk.publish_grads(
            model, epsilon=1.0, delta=1e-6, max_grad_norm=C, subjects=torch.zeros(4).long()
        )


def test_a_layer_called_twice_adds_both_calls(rng: np.random.Generator) -> None:
    n, d = 12, 3
    x, y = _data(rng, (n, d))
    torch.manual_seed(3)
    lin = torch.nn.Linear(d, d)

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.tanh(self.lin(t))).sum(dim=1, keepdim=True)

    model = Twice()
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.float32)
    F.mse_loss(model(X).squeeze(1), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.squeeze(1), t)

    want = _reference(model, loss, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _clip_nodes(model: torch.nn.Module, n: int) -> tuple[Any, list[tuple[int, ...]]]:
    """The clip node of the graph ``publish_grads`` sends, and the shapes of all nodes."""
    samples = per_sample.per_example_grads(
        list(model.parameters()), [k for k, _ in model.named_parameters()]
    )
    graph = graph_for([per_sample.clipped_sum(samples, max_norm=C, scale=float(n))])
    (clip,) = [node for node in graph.nodes if node.op == "clip_by_subject_norm"]
    return clip, [meta.shape for meta in plan(graph).metas]


def test_a_linear_layers_weight_gradients_are_sent_as_their_two_factors(
    rng: np.random.Generator,
) -> None:
    """An MLP step's graph carries each weight's per-example gradients as the factors
    (output gradient, input): the node never builds rows x out x in numbers; a layer called
    twice (two outer products added) sends its rows built, and both match torch.func."""
    n, d = 20, 6
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(d, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    clip, shapes = _clip_nodes(model, n)
    assert list(clip.attrs["outer"]) == [1, 0, 1, 0]
    assert len(clip.args) == 7  # (g, x) and bias for each layer, then the groups
    assert max(len(shape) for shape in shapes) == 2  # no [rows, out, in] anywhere
    x = rng.uniform(-1, 1, (n, d)).astype(np.float32)
    y = rng.integers(0, 3, n)
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    want = _reference(model, F.cross_entropy, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    per_sample.reset(list(model.parameters()))
    model.zero_grad(set_to_none=True)
    lin = torch.nn.Linear(d, d)
    twice = torch.nn.Sequential(lin, torch.nn.Tanh(), lin)
    twice(remote_input("X", (n, d), torch.float32)).sum().backward()
    clip, shapes = _clip_nodes(twice, n)
    assert not any(clip.attrs.get("outer") or ()) and (n, d, d) in shapes


def test_a_frozen_weight_leaves_the_bias_alone(rng: np.random.Generator) -> None:
    n, d = 7, 3
    x, y = _data(rng, (n, d))
    model = torch.nn.Linear(d, 1)
    model.weight.requires_grad_(False)
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.float32)
    F.mse_loss(model(X).squeeze(1), Y, reduction="sum").backward()
    assert model.weight.grad is None
    (samples,) = per_sample.per_example_grads([model.bias], ["bias"])
    value, grad_ = evaluate([samples, model.bias.grad], {"X": x, "y": y})  # type: ignore[list-item]
    assert value.shape == (n, 1)
    torch.testing.assert_close(value.sum(dim=0), grad_)


def test_a_linear_without_rows_is_refused() -> None:
    model = torch.nn.Linear(3, 1)
    model(remote_input("v", (3,), torch.float32)).sum().backward()
    with pytest.raises(sdk.DPNodeError, match=r"'weight': a layer saw an input without"):
        sdk.publish_grads(model, epsilon=1.0, delta=1e-6, max_grad_norm=C)


def test_the_recorded_mlp_step_is_tracked_at_2c_and_sound(rng: np.random.Generator) -> None:
    """The graph publish_grads sends for an MLP: 2C for the node, on neighbours at the bounds."""
    n, d = 16, 3
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(d, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    X, Y = remote_input("X", (n, d), torch.float64), remote_input("y", (n,), torch.float64)
    model.double()
    F.binary_cross_entropy_with_logits(model(X).squeeze(1), Y).backward()
    cols = {"X": Column("float64", (n, d), -1.0, 1.0), "y": Column("float64", (n,), 0.0, 1.0)}
    report = _assert_tracked_at_2c_and_sound(model, cols, rng, 100)
    assert report.l2 == pytest.approx(2 * C, rel=1e-9)  # and float64 rounding


def test_a_float32_softmax_mlp_step_is_tracked_at_2c_and_sound(rng: np.random.Generator) -> None:
    """cross_entropy over an MLP's float32 logits: a wide public logit range used to make
    exp overflow in the tracker's intervals, refusing the step ("finite bounds")."""
    n, d, k = 12, 8, 10
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.ReLU(), torch.nn.Linear(16, k))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # logits over a wide range: exp(hi(x) - lo(amax)) > float32's max
    X, Y = remote_input("X", (n, d), torch.float32), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    cols = {"X": Column("float32", (n, d), 0.0, 16.0), "y": Column("int64", (n,), 0, k - 1)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 60)


@pytest.mark.parametrize("per_row", [False, True])
def test_tracking_an_mlp_step_keeps_per_row_states_compact(
    monkeypatch: pytest.MonkeyPatch, per_row: bool
) -> None:
    """Per-example gradients are rows x parameters, but every row has the same bounds: the
    tracker's states must hold about rows + parameters numbers, not their product (which
    made tracking a digits MLP step take ~0.5 s, 95% of a publish). ``per_row``: the loss
    is ``reduction="none"`` and then ``.mean()`` (as ``sdk.private_training`` computes it),
    whose gradient is a public ``1/n`` on every row."""
    n = 300
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    X = remote_input("X", (n, 8, 8), torch.float32)
    Y = remote_input("y", (n,), torch.int64)
    logits = model(X.reshape(n, 64) / 16)
    if per_row:
        F.cross_entropy(logits, Y, reduction="none").mean().backward()
    else:
        F.cross_entropy(logits, Y).backward()
    fields = ("lo", "hi", "owner", "L", "G", "E", "clo", "chi")
    sizes = _tracked_sizes(monkeypatch, model, n, {"X": (0.0, 16.0), "y": (0, 9)}, fields)
    params = sum(p.numel() for p in model.parameters())
    assert params == 2410 and max(sizes)[0] <= n + params, max(sizes)


def _tracked_sizes(
    monkeypatch: pytest.MonkeyPatch,
    model: torch.nn.Module,
    n: int,
    bounds: dict[str, tuple[float, float]],
    fields: tuple[str, ...],
) -> list[tuple[int, str]]:
    """Track the step ``model``'s backward pass recorded (``n`` rows, one subject each, at
    exactly 2C), and return, per node, the most numbers any of its state's ``fields`` holds,
    with the node's prim."""
    names = [k for k, _ in model.named_parameters()]
    samples = per_sample.per_example_grads(list(model.parameters()), names)
    graph = graph_for([per_sample.clipped_sum(samples, max_norm=C, scale=float(n))])
    rows = Subjects.identity(n)
    specs = {name: InputSpec.private(lo, hi, rows) for name, (lo, hi) in bounds.items()}
    sizes: list[tuple[int, str]] = []
    visit = tracker_module.PrivacyTracker.visit

    def recording(self: Any, index: int, *args: Any) -> Any:
        state = visit(self, index, *args)
        arrays = [getattr(state, f) for f in fields if getattr(state, f) is not None]
        sizes.append((max(np.size(a) for a in arrays), graph.nodes[index].op))
        return state

    monkeypatch.setattr(tracker_module.PrivacyTracker, "visit", recording)
    assert track(graph, specs).outputs[0].exact_l2 == 2 * C
    return sizes


def _cnn(kind: str) -> torch.nn.Module:
    if kind == "conv2d":
        return torch.nn.Sequential(
            torch.nn.Conv2d(2, 4, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AvgPool2d(2),
            torch.nn.Conv2d(4, 4, 2, stride=2, groups=2, bias=False),
            torch.nn.Flatten(),
            torch.nn.Linear(4, 3),
        )
    if kind == "conv1d":  # dilation, and padding_mode="reflect" (a pad before the conv)
        return torch.nn.Sequential(
            torch.nn.Conv1d(2, 3, 3, dilation=2, padding=2, padding_mode="reflect"),
            torch.nn.Tanh(),
            torch.nn.Flatten(),
            torch.nn.Linear(24, 3),
        )
    return torch.nn.Sequential(  # conv3d, padding="same"
        torch.nn.Conv3d(2, 2, 3, padding="same"),
        torch.nn.Sigmoid(),
        torch.nn.Flatten(),
        torch.nn.Linear(2 * 2 * 4 * 4, 3),
    )


@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "conv3d"])
def test_convolutions_match_torch_func(rng: np.random.Generator, kind: str) -> None:
    """Per-example gradients of convolution layers (recorded as windows times the output's
    gradient), clipped per example, against torch.func on the same values."""
    n = 6
    shape = {"conv1d": (n, 2, 8), "conv2d": (n, 2, 4, 4), "conv3d": (n, 2, 2, 4, 4)}[kind]
    x = rng.uniform(0, 1, shape).astype(np.float32)
    y = rng.integers(0, 3, n)
    torch.manual_seed(3)
    model = _cnn(kind)
    X, Y = remote_input("X", shape, torch.float32), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    want = _reference(model, F.cross_entropy, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_cnn_step_is_tracked_at_2c_and_sound(rng: np.random.Generator) -> None:
    """The graph publish_grads sends for a CNN: 2C for the node, on neighbours at the bounds."""
    n, shape = 6, (6, 2, 4, 4)
    torch.manual_seed(4)
    model = _cnn("conv2d")
    X, Y = remote_input("X", shape, torch.float32), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    cols = {"X": Column("float32", shape, 0.0, 1.0), "y": Column("int64", (n,), 0, 2)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 40)


def _normed(kind: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    n = 6
    if kind == "layernorm":  # over (sequence, features) rows: a middle dim summed
        return torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.LayerNorm(8),
            torch.nn.Tanh(),
            torch.nn.Flatten(),
            torch.nn.Linear(24, 3),
        ), (n, 3, 4)
    norm = (
        torch.nn.GroupNorm(2, 4) if kind == "groupnorm" else torch.nn.InstanceNorm2d(4, affine=True)
    )
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        norm,
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    ), (n, 1, 4, 4)


@pytest.mark.parametrize("kind", ["layernorm", "groupnorm", "instancenorm"])
def test_normalisation_layers_match_torch_func(rng: np.random.Generator, kind: str) -> None:
    torch.manual_seed(5)
    model, shape = _normed(kind)
    with torch.no_grad():  # affine parameters away from their initial 1 and 0
        for p in model[1].parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    n = shape[0]
    x = rng.uniform(0, 1, shape).astype(np.float32)
    y = rng.integers(0, 3, n)
    X, Y = remote_input("X", shape, torch.float32), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    want = _reference(model, F.cross_entropy, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    cols = {"X": Column("float32", shape, 0.0, 1.0), "y": Column("int64", (n,), 0, 2)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)  # the node bounds the step


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_an_embedding_matches_torch_func(rng: np.random.Generator, padding_idx: int | None) -> None:
    """Token ids are private: the table is read at private positions (a lookup rule) and
    its per-example gradients are one-hot codes times the output gradients."""
    n, t, vocab = 6, 5, 7
    torch.manual_seed(6)
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, 3, padding_idx=padding_idx),
        torch.nn.Flatten(),
        torch.nn.Linear(t * 3, 2),
    )
    x = rng.integers(0, vocab, (n, t))
    y = rng.integers(0, 2, n)
    X, Y = remote_input("X", (n, t), torch.int64), remote_input("y", (n,), torch.int64)
    F.cross_entropy(model(X), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    want = _reference(model, F.cross_entropy, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    cols = {"X": Column("int64", (n, t), 0, vocab - 1), "y": Column("int64", (n,), 0, 1)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation"),
    [(2, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 2), (2, 3, 0, 1)],
)
def test_max_pool_gradient_on_private_images_matches_torch(
    rng: np.random.Generator, kernel: int, stride: int, padding: int, dilation: int
) -> None:
    """On private images the max pool's gradient is recorded tap by tap (no scatter at a
    private position); it must equal torch's, ties included (repeated values in [0, 3])."""
    shape = (3, 2, 7, 6)
    x = rng.integers(0, 4, shape).astype(np.float32)  # many ties inside windows
    go_seed = torch.Generator().manual_seed(1)
    X = remote_input("X", shape, torch.float32, private=True).requires_grad_()
    pool = torch.nn.MaxPool2d(kernel, stride, padding, dilation)
    out = pool(X)
    weights = torch.randn(out.shape, generator=go_seed)
    (out * weights).sum().backward()
    (got,) = evaluate([X.grad], {"X": x})  # type: ignore[list-item]
    local = torch.from_numpy(x).requires_grad_()
    (pool(local) * weights).sum().backward()
    assert local.grad is not None
    torch.testing.assert_close(got, local.grad, rtol=0, atol=1e-6)


def test_a_max_pool_cnn_step_is_tracked_at_2c_and_sound(rng: np.random.Generator) -> None:
    n, shape = 5, (5, 1, 6, 6)
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(3, 2, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(2, 2),
    )
    X = remote_input("X", shape, torch.float32, private=True)
    Y = remote_input("y", (n,), torch.int64, private=True)
    F.cross_entropy(model(X), Y).backward()
    cols = {"X": Column("float32", shape, 0.0, 1.0), "y": Column("int64", (n,), 0, 1)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)


class _Attention(torch.nn.Module):
    """A projection, multi-head attention (self or over other keys and values), a head."""

    def __init__(self, cross: bool, causal: bool = False) -> None:
        super().__init__()
        self.cross, self.causal = cross, causal
        self.embed = torch.nn.Linear(4, 8)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        kv = torch.tanh(h) if self.cross else h
        mask = torch.ones(5, 5, dtype=torch.bool).triu(1) if self.causal else None
        out, _ = self.attn(h, kv, kv, need_weights=False, attn_mask=mask, is_causal=self.causal)
        return self.head(out.mean(dim=1))


@pytest.mark.parametrize("kind", ["self", "cross", "causal", "transformer"])
def test_attention_matches_torch_func(rng: np.random.Generator, kind: str) -> None:
    """Multi-head attention (and so a transformer layer) on private sequences: recorded with
    batched matmuls of each example's heads, and its projections' per-example gradients."""
    n, shape = 6, (6, 5, 4)
    torch.manual_seed(8)
    model: torch.nn.Module
    if kind == "transformer":
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            torch.nn.Flatten(),
            torch.nn.Linear(40, 3),
        )
    else:
        model = _Attention(cross=kind == "cross", causal=kind == "causal")
    x = rng.uniform(0, 1, shape).astype(np.float32)
    y = rng.integers(0, 3, n)
    X = remote_input("X", shape, torch.float32, private=True)
    Y = remote_input("y", (n,), torch.int64, private=True)
    F.cross_entropy(model(X), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    want = _reference(model, F.cross_entropy, torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    cols = {"X": Column("float32", shape, 0.0, 1.0), "y": Column("int64", (n,), 0, 2)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)


def test_tracking_attention_keeps_one_bound_per_head_not_per_example(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attention over examples whose bounds are alike: the tracked bounds of the scores,
    their softmax and its products are one per head and position, not one per example and
    head (torch folds a 4-d matmul's examples and heads into one batch dim, along which
    per-head bounds repeat with a period no broadcast view can hold: every state from the
    scores on held rows x heads x L x S numbers, and a digits transformer took ~0.6 s to
    track)."""
    n, shape = 400, (400, 5, 4)
    torch.manual_seed(9)
    model = _Attention(cross=False)
    X = remote_input("X", shape, torch.float32, private=True)
    Y = remote_input("y", (n,), torch.int64, private=True)
    F.cross_entropy(model(X), Y).backward()
    sizes = _tracked_sizes(monkeypatch, model, n, {"X": (0.0, 1.0), "y": (0, 2)}, ("lo", "hi"))
    # every state but the groups' (the rows numbered, one per row) holds fewer numbers than
    # rows; rows x heads x 5 x 5 (20,000) before
    assert max(size for size, op in sizes if op not in ("constant", "arange")) < n, max(sizes)


@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_outputs_and_weights_are_torch_s(
    rng: np.random.Generator, is_causal: bool
) -> None:
    torch.manual_seed(9)
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = rng.uniform(-1, 1, (3, 5, 8)).astype(np.float32)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1) if is_causal else None
    X = remote_input("X", x.shape, torch.float32, private=True)
    out, weights = attn(X, X, X, attn_mask=None, is_causal=False, need_weights=True)
    if is_causal:  # is_causal without a mask: attention to earlier positions only
        out = attn(X, X, X, need_weights=False, is_causal=True, attn_mask=mask)[0]
    got = evaluate([out] if is_causal else [out, weights], {"X": x})
    with torch.no_grad():
        local = torch.from_numpy(x)
        if is_causal:
            want = [attn(local, local, local, need_weights=False, attn_mask=mask)[0]]
        else:
            want = list(attn(local, local, local, need_weights=True))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _loop_reference(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """Per-example clipped sum from one local backward pass per example (for layers
    torch.func cannot vmap)."""
    rows = []
    for i in range(len(y)):
        model.zero_grad()
        xi, yi = torch.from_numpy(x[i : i + 1]), torch.from_numpy(y[i : i + 1])
        F.cross_entropy(model(xi), yi).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    flat = torch.stack(rows)
    return (flat * torch.clamp(C / flat.norm(dim=1, keepdim=True), max=1.0)).sum(dim=0)


class _Recurrent(torch.nn.Module):
    """A recurrent layer over (rows, time, features), its last step into a head."""

    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn, self.head = rnn, torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = getattr(self.rnn, "batch_first", True)
        out = self.rnn(x if first else x.transpose(0, 1))[0]
        return self.head(out[:, -1] if first else out[-1])


RECURRENT: dict[str, Callable[[], torch.nn.Module]] = {
    "rnn": lambda: torch.nn.RNN(4, 8, batch_first=True),
    "rnn_relu_2_layers": lambda: torch.nn.RNN(4, 8, 2, nonlinearity="relu", batch_first=True),
    "gru": lambda: torch.nn.GRU(4, 8, batch_first=True),
    "lstm": lambda: torch.nn.LSTM(4, 8, batch_first=True),
    "lstm_2_layers_time_first": lambda: torch.nn.LSTM(4, 8, 2, bias=False),
}


@pytest.mark.parametrize("kind", sorted(RECURRENT))
def test_recurrent_layers_match_per_example_backward(rng: np.random.Generator, kind: str) -> None:
    """RNN, GRU and LSTM on private sequences, unrolled (dpnode/sdk/_recurrent.py): per-example
    gradients against one backward pass per example (torch.func cannot vmap them)."""
    n, shape = 6, (6, 5, 4)
    torch.manual_seed(10)
    model = _Recurrent(RECURRENT[kind]())
    x = rng.uniform(0, 1, shape).astype(np.float32)
    y = rng.integers(0, 3, n)
    X = remote_input("X", shape, torch.float32, private=True)
    Y = remote_input("y", (n,), torch.int64, private=True)
    F.cross_entropy(model(X), Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    torch.testing.assert_close(got, _loop_reference(model, x, y), rtol=1e-4, atol=1e-5)
    model.zero_grad()
    F.cross_entropy(model(X), Y).backward()
    cols = {"X": Column("float32", shape, 0.0, 1.0), "y": Column("int64", (n,), 0, 2)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_an_embedding_bag_matches_per_example_backward(rng: np.random.Generator, mode: str) -> None:
    """Bags of private token ids, one per row (dpnode/sdk/_bags.py): torch's values, and per-example
    gradients of the table against one backward pass per example."""
    n, bag, vocab = 6, 5, 7
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(vocab, 4, mode=mode), torch.nn.Linear(4, 2))
    x = rng.integers(0, vocab, (n, bag))
    y = rng.integers(0, 2, n)
    X = remote_input("X", (n, bag), torch.int64, private=True)
    Y = remote_input("y", (n,), torch.int64, private=True)
    out = model(X)
    (values,) = evaluate([out], {"X": x})
    torch.testing.assert_close(values, model(torch.from_numpy(x)), rtol=1e-6, atol=1e-6)
    F.cross_entropy(out, Y).backward()
    got = _remote_clipped(model, {"X": x, "y": y}, rows=n)
    torch.testing.assert_close(got, _loop_reference(model, x, y), rtol=1e-4, atol=1e-5)
    model.zero_grad()
    F.cross_entropy(model(X), Y).backward()
    cols = {"X": Column("int64", (n, bag), 0, vocab - 1), "y": Column("int64", (n,), 0, 1)}
    _assert_tracked_at_2c_and_sound(model, cols, rng, 20)
