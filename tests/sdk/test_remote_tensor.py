"""Remote tensors from a real node (in process): columns, models, mock mode, errors, the wire."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.engine import decode, infer
from dpnode.sdk._remote import encode_graph, evaluate, graph_for, remote_input
from dpnode.sdk._remote.graph import TORCH_OF
from tests.sdk.conftest import remote_dataset

pytestmark = pytest.mark.usefixtures("sqlite_only")


def test_column_is_a_remote_tensor_without_values(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    age = ds["age"]
    assert isinstance(age, sdk.RemoteTensor) and isinstance(age, torch.Tensor)
    assert age.shape == (40,) and age.dtype == torch.int64
    assert age._meta.device.type == "meta"  # shape/dtype propagation runs on meta tensors
    m = age.float().mean()
    assert (
        repr(m)
        == "RemoteTensor(shape=(), dtype=torch.float32, source=dataset 'cohort'['age'], ops=2)"
    )
    assert str(m) == repr(m)
    g = m.graph()
    assert [n.op for n in g.nodes] == ["input", "convert_element_type", "mean"]
    assert g.input_names() == [f"dataset:{ds.id}/age"]
    # shape and dtype agree with the node's own inference
    (meta,) = infer(g)
    assert meta.shape == () and meta.dtype.name == "float32"
    assert ds["sex"].dtype == torch.int64 and ds["diabetic"].dtype == torch.bool
    assert ds["scan"].shape == (40, 2, 3) and ds["scan"].dtype == torch.float32
    with pytest.raises(KeyError, match="no column 'weight'"):
        ds["weight"]


def test_mock_mode_evaluates_with_the_engine_like_torch(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    fake = ds.mock()
    with sdk.mock(ds) as m:
        age = ds["age"]
        assert age.shape == (30,)  # the mock's rows, not the data's
        mean = age.float().mean()
        got = m.evaluate(mean)
        want = torch.from_numpy(fake["age"]).float().mean()
        assert torch.equal(got, want)
        X = ds.tensors("age", "bmi")
        assert X.shape == (30, 2) and X.dtype == torch.float32
        both = m.evaluate(X, X.std(0))
        ref = torch.stack([torch.from_numpy(fake["age"]).float(), torch.from_numpy(fake["bmi"])], 1)
        torch.testing.assert_close(both[0], ref, rtol=0, atol=0)
        torch.testing.assert_close(both[1], ref.std(0))
        # a column not covered by the session is reported by name
        with pytest.raises(sdk.DPNodeError, match="no mock values"):
            sdk.mock().evaluate(mean)
    assert ds["age"].shape == (40,)  # outside the block: the real shape again


def test_tensors_stacks_scalar_columns_and_splits_others(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    X = ds.tensors("age", "bmi", "diabetic")
    assert X.shape == (40, 3) and X.dtype == torch.float32
    scan, label = ds.tensors("scan", "diabetic")  # a per-row shape: one tensor per column
    assert scan.shape == (40, 2, 3) and label.dtype == torch.bool
    Xs, y = ds.tensors(["age", "scan"], "diabetic")
    assert Xs.shape == (40, 7) and y.shape == (40,)
    assert ds.tensors(["age", "scan"]).shape == (40, 7)  # one list: its matrix, not a 1-tuple
    a, b = ds.tensors("age", "bmi", stack=False)
    assert (a.dtype, b.dtype) == (torch.int64, torch.float32)
    with sdk.mock(ds) as m:
        Xm = ds.tensors("bmi", "age", stack=True)
        fake = ds.mock()
        torch.testing.assert_close(
            m.evaluate(Xm),
            torch.stack([torch.from_numpy(fake["bmi"]), torch.from_numpy(fake["age"]).float()], 1),
        )


def test_model_state_dict_trains_against_a_dataset(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1)
    owner_client.upload_model("lin", net, tags=["health"], public=True)
    model = ds_client.model("lin")
    state = model.state_dict()
    assert set(state) == {"weight", "bias"} and all(
        isinstance(t, sdk.RemoteTensor) for t in state.values()
    )
    assert state["weight"].shape == (1, 2)
    with sdk.mock(ds, model) as m:
        X = ds.tensors("age", "bmi")
        w = model.state_dict()
        out = X @ w["weight"].T + w["bias"]
        fake = ds.mock()
        Xl = torch.stack([torch.from_numpy(fake["age"]).float(), torch.from_numpy(fake["bmi"])], 1)
        torch.testing.assert_close(m.evaluate(out), net(Xl).detach())


def test_mock_training_loop_matches_torch(ds_client: sdk.Client, owner_client: sdk.Client) -> None:
    ds = remote_dataset(owner_client, ds_client)
    fake = ds.mock()
    Xl = torch.stack(
        [torch.from_numpy(fake["age"]).float() / 100, torch.from_numpy(fake["bmi"]) / 50], 1
    )
    yl = torch.from_numpy(fake["diabetic"]).float()

    def make() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    remote, local = make(), make()
    opt_r = torch.optim.SGD(remote.parameters(), lr=0.5)
    opt_l = torch.optim.SGD(local.parameters(), lr=0.5)
    with sdk.mock(ds) as m:
        X = ds.tensors("age", "bmi") / torch.tensor([100.0, 50.0])
        y = ds["diabetic"].float()
        for _ in range(4):
            loss = F.binary_cross_entropy_with_logits(remote(X).squeeze(1), y)
            loss.backward()
            assert all(isinstance(p.grad, sdk.RemoteTensor) for p in remote.parameters())
            loss_value = m.evaluate(loss)
            m.materialize_grads(remote)
            opt_r.step()
            opt_r.zero_grad()
            ref = F.binary_cross_entropy_with_logits(local(Xl).squeeze(1), yl)
            ref.backward()
            opt_l.step()
            opt_l.zero_grad()
            torch.testing.assert_close(loss_value, ref.detach(), rtol=0, atol=1e-6)
    for p, q in zip(remote.parameters(), local.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-6)


def test_data_dependent_code_raises_private_value_error(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    bmi = ds["bmi"]
    cases = {
        "tensor.item()": lambda: bmi.mean().item(),
        "bool(tensor)": lambda: bool(bmi.mean() > 30),
        "tolist": lambda: bmi.tolist(),
        "numpy": lambda: bmi.numpy(),
        "torch.nonzero": lambda: torch.nonzero(bmi > 30),
        "remote boolean mask": lambda: bmi[bmi > 30],
        "torch.unique": lambda: torch.unique(ds["sex"]),
        "float(tensor)": lambda: float(bmi.sum()),
    }
    for what, fn in cases.items():
        with pytest.raises(sdk.PrivateValueError, match="stay on the node") as info:
            fn()
        assert "publish" in str(info.value), what
        assert isinstance(info.value, sdk.DPNodeError)
    with pytest.raises(sdk.PrivateValueError, match=r"torch\.where"):
        bool(bmi.mean() > 30)
    # the same code fails the same way in mock mode: a dry run finds it before any budget is spent
    with sdk.mock(ds), pytest.raises(sdk.PrivateValueError):
        ds["bmi"].mean().item()
    # what torch.where offers instead works remotely
    capped = torch.where(bmi > 30, bmi, torch.zeros(()))
    assert capped.shape == (40,)


def test_unsupported_ops_name_the_op_and_the_docs(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    with pytest.raises(sdk.UnsupportedOperationError, match=r"aten\.\w*fft.*docs/prims\.md"):
        torch.fft.rfft(ds.tensors("age", "bmi"))
    # an optimizer cannot step on unpublished gradients
    p = torch.nn.Parameter(torch.zeros(2))
    (ds.tensors("age", "bmi") * p).sum().backward()
    with pytest.raises(sdk.PrivateValueError, match="publish_grads"):
        torch.optim.SGD([p], lr=0.1).step()


def test_graph_encodes_once_and_a_loop_keeps_its_structure(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    net = torch.nn.Linear(2, 1)
    hashes, constants = [], []
    X = ds.tensors("age", "bmi")
    for step in range(3):
        with torch.no_grad():
            net.weight.add_(0.1 * step)
        loss = net(X).square().mean()
        enc = encode_graph(graph_for([loss]))
        assert decode(enc.frame).outputs == (len(decode(enc.frame).nodes) - 1,)
        hashes.append(enc.structure_hash)
        constants.append(enc.frame[len(enc.frame) - enc.constant_bytes :])
    # new weights, same structure: the client sends it by reference (tests/sdk/test_structures.py)
    assert len(set(hashes)) == 1 and len(set(constants)) == 3


def test_dtypes_and_shapes_agree_with_the_engine(
    ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    from dpnode.sdk._remote import remote_input

    ds = remote_dataset(owner_client, ds_client)
    age, bmi, sex, flag = ds["age"], ds["bmi"], ds["sex"], ds["diabetic"]
    # cumsum and sort have no privacy rule: on the private columns they are refused as they
    # are recorded (tests/sdk/test_not_publishable.py), so they run on public stand-ins here
    public_age = remote_input("age", tuple(age.shape), age.dtype)
    public_bmi = remote_input("bmi", tuple(bmi.shape), bmi.dtype)
    exprs = [
        age / 2,
        age // 3,
        age * 1.5,
        age + bmi,
        flag + 1,
        flag & (age > 40),
        sex.sum(),
        public_age.cumsum(0),
        bmi.double() * age,
        (age > 3).float().mean(),
        bmi.argmax(),
        torch.maximum(age, sex),
        age.reshape(4, 10).sum(1, keepdim=True),
        bmi.unsqueeze(1).expand(40, 3),
        F.softmax(bmi, 0),
        torch.where(flag, age, 0),
        age.to(torch.int32) * 2,
        bmi.half() + 1,
        public_bmi.sort().values,
        torch.cat([age, sex]).float().var(),
        ds["scan"].permute(2, 0, 1)[1:, ::2],
    ]
    for t in exprs:
        (meta,) = infer(graph_for([t]))
        assert meta.shape == tuple(t.shape), t
        assert TORCH_OF[meta.dtype.name] == t.dtype, t


def test_remote_tensors_cannot_be_pickled(ds_client: sdk.Client, owner_client: sdk.Client) -> None:
    import pickle

    ds = remote_dataset(owner_client, ds_client)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ds["age"])


def test_search_then_compute_as_in_the_readme(
    http: TestClient, ds_client: sdk.Client, owner_client: sdk.Client
) -> None:
    remote_dataset(owner_client, ds_client)
    ds = sdk.search(tags=["health"])[0]
    assert isinstance(ds, sdk.DatasetHandle)
    age = ds["age"]
    with sdk.mock(ds) as m:
        assert np.isclose(float(m.evaluate(ds["age"].float().mean())), ds.mock()["age"].mean())
    assert age.float().mean().shape == ()


def test_local_tensors_travel_once_per_version() -> None:
    from dpnode.sdk._remote import remote_input

    x = remote_input("x", (3,), torch.float32)
    w = torch.ones(3)
    g = graph_for([x * w + w])
    assert [n.op for n in g.nodes].count("constant") == 1  # the same tensor, the same constant
    w.add_(1)
    g2 = graph_for([x * w])
    (const,) = [n for n in g2.nodes if n.op == "constant"]
    assert const.value is not None and const.value.tolist() == [2.0, 2.0, 2.0]
    w.data = torch.zeros(3)  # a new buffer: new values
    (const,) = [n for n in graph_for([x * w]).nodes if n.op == "constant"]
    assert const.value is not None and const.value.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_records_torch_s_semantics(inplace: bool) -> None:
    """In training, dropout zeroes each value with probability p (drawn on the node) and
    scales the rest by 1 / (1 - p); it used to fail as it was recorded (bernoulli_ with a
    probability was taken for bernoulli of the tensor's own values)."""
    x = np.random.default_rng(3).uniform(1, 2, (40, 60)).astype(np.float32)
    X = remote_input("X", x.shape, torch.float32, private=True)
    y = torch.nn.Dropout(0.3, inplace=inplace)(X * 1.0)
    (v,) = evaluate([y], {"X": x})
    dropped = v.numpy() == 0
    assert abs(dropped.mean() - 0.3) < 0.05  # 2400 draws: the sd of the fraction is 0.009
    np.testing.assert_allclose(v.numpy()[~dropped], x[~dropped] / 0.7, rtol=1e-6)
