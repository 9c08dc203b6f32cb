"""What recording remote tensors costs, against torch running the same code on meta tensors.

    python -m bench.sdk [--repeat N]

Prints, for single ops and for a forward+backward step of a 3-layer MLP and a
small CNN: the time to record the ops into a graph (RemoteTensor) divided by
the time plain torch takes to run the same code on ``meta`` tensors (shape
and dtype propagation only, no values: the floor for any recording scheme
built on torch's dispatcher). Then, per training step, the time to build and
encode the graph and the size of the frame (structure + constants). The
target is recording within 3x of meta execution.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.timing import best
from dpnode.core import structures
from dpnode.sdk._remote import build, encode_graph, remote_input


def _ops(repeat: int) -> list[tuple[str, float, float]]:
    x_r = remote_input("x", (256, 64), torch.float32)
    w_r = remote_input("w", (64, 64), torch.float32)
    x_m = torch.empty(256, 64, device="meta")
    w_m = torch.empty(64, 64, device="meta")
    cases: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "add": lambda x, w: x + 1.0,
        "mul tensor": lambda x, w: x * x,
        "matmul": lambda x, w: x @ w,
        "sum(dim)": lambda x, w: x.sum(1),
        "relu": lambda x, w: torch.relu(x),
        "reshape": lambda x, w: x.reshape(64, 256),
        "exp": lambda x, w: x.exp(),
        "softmax": lambda x, w: F.softmax(x, -1),
        "x[idx] slice": lambda x, w: x[3:100:2],
    }
    out = []
    for name, fn in cases.items():
        rec = best(lambda fn=fn: fn(x_r, w_r), repeat, 200)
        meta = best(lambda fn=fn: fn(x_m, w_m), repeat, 200)
        out.append((name, rec, meta))
    return out


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 7 * 7, 10),
    )


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, classes: bool) -> torch.Tensor:
    out = model(x)
    loss = F.cross_entropy(out, y) if classes else F.mse_loss(out.squeeze(1), y)
    loss.backward()
    return loss


def _remote_step(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, classes: bool
) -> list[Any]:
    model.zero_grad(set_to_none=True)
    loss = _step(model, x, y, classes)
    return [loss, *(p.grad for p in model.parameters())]


def _meta_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, classes: bool) -> None:
    model.zero_grad(set_to_none=True)
    _step(model, x, y, classes)


def _encode(nodes: list[Any]) -> Any:
    return encode_graph(build(nodes))


def _training(repeat: int) -> list[tuple[str, float, float, float, int, int]]:
    rows = []
    for name, make, xshape, classes in (
        ("3-layer MLP (batch 256)", _mlp, (256, 32), False),
        ("small CNN (batch 64, 28x28)", _cnn, (64, 1, 28, 28), True),
    ):
        torch.manual_seed(0)
        model = make()
        ydtype = torch.int64 if classes else torch.float32
        x_r = remote_input("x", xshape, torch.float32)
        y_r = remote_input("y", (xshape[0],), ydtype)
        meta_model = make().to("meta")
        x_m = torch.empty(xshape, device="meta")
        y_m = torch.empty(xshape[0], dtype=ydtype, device="meta")
        rec = best(functools.partial(_remote_step, model, x_r, y_r, classes), repeat, 5)
        meta = best(functools.partial(_meta_step, meta_model, x_m, y_m, classes), repeat, 5)
        nodes = [t.node for t in _remote_step(model, x_r, y_r, classes)]
        enc_time = best(functools.partial(_encode, nodes), repeat, 3)
        enc = _encode(nodes)
        # the first step sends the whole frame; later ones a reference and the constants
        later = len(structures.reference(bytes(32), structures.split(enc.frame)[1]))
        rows.append((name, rec, meta, enc_time, len(enc.frame), later))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; best of {args.repeat}\n")
    print(f"{'op':<16}{'record (us)':>14}{'meta (us)':>12}{'ratio':>8}")
    for name, rec, meta in _ops(args.repeat):
        print(f"{name:<16}{rec * 1e6:>14.1f}{meta * 1e6:>12.1f}{rec / meta:>8.2f}")
    print()
    print(
        f"{'forward+backward step':<30}{'record (ms)':>12}{'meta (ms)':>11}{'ratio':>7}"
        f"{'build+encode (ms)':>19}{'1st step (KiB)':>16}{'later (KiB)':>13}"
    )
    for name, rec, meta, enc, frame, later in _training(args.repeat):
        print(
            f"{name:<30}{rec * 1e3:>12.2f}{meta * 1e3:>11.2f}{rec / meta:>7.2f}{enc * 1e3:>19.2f}"
            f"{frame / 1024:>16.1f}{later / 1024:>13.1f}"
        )
    print("\n1st step: the whole frame (structure + constants); later steps of the same")
    print("structure: a 36-byte reference + the constants (dpnode.core.structures)")


if __name__ == "__main__":
    main()
