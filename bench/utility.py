"""Private training against Opacus: test accuracy at the same (epsilon, delta), and wall time.

    python -m bench.utility [--seeds 5] [--rows logistic,mlp] [--quick]

Each row trains one model on a scikit-learn dataset (80% of it, split by the seed; the other
20% is the local test set) to a total ``epsilon`` at ``delta = 1e-5``, twice in the same run:

* **dpnode**: the training split is uploaded to an in-process node (the real app, SQLite, the
  SDK over its transport); a fresh data scientist, whose policy allocation is exactly
  ``(epsilon, 1e-5)``, trains with ``sdk.private_training(model, optimizer, (X, y),
  target_epsilon=epsilon, steps=steps, max_grad_norm=C)``: full-batch DP-GD (every step
  clips each row's gradient and adds Gaussian noise for ``2C``), ``steps`` steps at the
  per-step epsilon that the node's filter lets ``steps`` releases fit. The epsilon reported
  is the node's ledger (``client.budget()``), not this script's arithmetic.
* **Opacus** (1.6, local): ``make_private_with_epsilon`` with Poisson sampling and its RDP
  accountant, the same model and initialisation, ``epochs`` epochs of expected batch size
  ``batch``.

A third column trains Opacus at dpnode's guarantee: ``(epsilon, delta)`` between datasets
that differ by *replacing* a row follows from ``(epsilon / 2, delta / (1 + e^(epsilon / 2)))``
for adding or removing one (a replacement is a removal and an addition); Opacus's
accountants do not analyse Poisson sampling under replacement directly, so this is
conservative for Opacus.

Features are scaled into [0, 1] by public bounds (breast cancer: each column's range over the
whole dataset, declared as the contract; digits: grey levels 0-16) for both. Neighbouring
datasets differ for dpnode by *replacing* a row (the node's privacy unit) and for Opacus by
adding or removing one (its default): dpnode's guarantee is the stronger one at the same
numbers. Time is the whole training run (for dpnode: recording, HTTP, tracking, evaluation
and noise of every step; for Opacus: its data loader, hooks and optimizer), without the
upload and the accuracy check.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.services import users
from dpnode.node.settings import Settings

DELTA = 1e-5
PASSWORD = "bench password"


@dataclass(frozen=True)
class Row:
    data: str  # "breast_cancer" or "digits"
    model: str  # "logistic", "softmax", "mlp", "cnn"
    epsilon: float
    #: dpnode: full-batch steps, Adam's learning rate, the clipping bound
    steps: int
    lr: float
    clip: float
    #: Opacus: epochs, expected batch size, SGD's learning rate, the clipping bound
    epochs: int = 30
    batch: int = 128
    opacus_lr: float = 0.5
    opacus_clip: float = 1.0

    @property
    def name(self) -> str:
        return f"{self.data} {self.model}, epsilon {self.epsilon:g}"


#: Both sides' settings were chosen on a validation split of the training rows (3 seeds, the
#: test rows untouched): dpnode over steps {3 .. 160}, Adam's lr {0.01 .. 1} and the clipping
#: bound {0.1, 0.3, 1}; Opacus over lr {0.1 .. 2}, batch {64, 128, 256}, epochs {10, 20, 30}.
ROWS = [
    Row("breast_cancer", "logistic", 1.0, 80, 0.3, 0.1, epochs=10, batch=128, opacus_lr=2.0),
    Row("breast_cancer", "logistic", 4.0, 80, 0.3, 0.3, epochs=20, batch=64, opacus_lr=2.0),
    Row("digits", "softmax", 1.0, 80, 0.1, 0.1, epochs=30, batch=256, opacus_lr=1.0),
    Row("digits", "mlp", 1.0, 80, 0.03, 0.1, epochs=10, batch=64, opacus_lr=0.5),
    Row("digits", "mlp", 8.0, 80, 0.03, 1.0, epochs=30, batch=256, opacus_lr=2.0),
    Row("digits", "cnn", 1.0, 80, 0.1, 0.1, epochs=20, batch=128, opacus_lr=1.0),
    Row("digits", "cnn", 8.0, 80, 0.1, 1.0, epochs=30, batch=128, opacus_lr=2.0),
]


def load(name: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Features scaled into [0, 1] by public bounds, labels, and one example's shape."""
    from sklearn.datasets import load_breast_cancer, load_digits

    if name == "digits":
        d = load_digits()
        return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64), (1, 8, 8)
    d = load_breast_cancer()
    lo, hi = d.data.min(axis=0), d.data.max(axis=0)
    x = ((d.data - lo) / (hi - lo)).astype(np.float32)
    return x, d.target.astype(np.int64), (x.shape[1],)


def make_model(kind: str, features: tuple[int, ...]) -> torch.nn.Module:
    flat = math.prod(features)
    if kind == "logistic":
        return torch.nn.Linear(flat, 1)
    if kind == "softmax":
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(flat, 10))
    if kind == "mlp":
        return torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(flat, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
        )
    return torch.nn.Sequential(  # a small CNN
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def loss_of(kind: str, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    if kind == "logistic":
        return F.binary_cross_entropy_with_logits(out.squeeze(1), y.float(), reduction=reduction)
    return F.cross_entropy(out, y, reduction=reduction)


def accuracy(kind: str, model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    pred = (out.squeeze(1) > 0).long() if kind == "logistic" else out.argmax(1)
    return float((pred.numpy() == y).mean())


@contextmanager
def in_process_node(data_dir: Path) -> Iterator[Callable[[str], sdk.Client]]:
    """A node with an admin, in process; yields a login function."""
    settings = Settings(
        data_dir=data_dir,
        argon2_memory_kib=8192,
        argon2_time_cost=1,
        max_upload_bytes=1 << 30,
        # one client logs in as every row's analyst, from one address, within seconds
        login_max_attempts_per_address=100_000,
    )
    upgrade(settings.resolved_database_url)
    context = NodeContext.from_settings(settings)
    with context.sessions() as session:
        for email, role in (("admin@x.org", "admin"), ("owner@x.org", "data_owner")):
            users.create_user(
                session, context.hasher, None, email=email, password=PASSWORD, role=role
            )
    with TestClient(create_app(context=context)) as http:
        yield lambda email: sdk.login(
            "http://bench", email=email, password=PASSWORD, transport=http._transport
        )
    context.close()


def train_dpnode(
    login: Callable[[str], sdk.Client], row: Row, x: np.ndarray, y: np.ndarray, seed: int, run: str
) -> tuple[torch.nn.Module, float, float]:
    """Upload, allocate, train; returns the model, the seconds and the ledger's epsilon."""
    admin, owner = login("admin@x.org"), login("owner@x.org")
    column = "image" if row.data == "digits" else "features"
    owner.upload_dataset(
        run, {column: x, "label": y}, bounds={column: (0.0, 1.0), "label": (0, int(y.max()))}
    )
    admin.set_policy(
        f"[roles.data_scientist]\nepsilon = {row.epsilon!r}\ndelta = {DELTA!r}\n", reason=run
    )
    admin.create_user(f"{run}@x.org", PASSWORD)
    client = login(f"{run}@x.org")
    ds = client.dataset(run)
    xr, yr = ds.tensors(column, "label")
    if row.data == "digits":
        xr = xr.float().unsqueeze(1)
    torch.manual_seed(seed)
    model = make_model(row.model, tuple(x.shape[1:]) if row.data != "digits" else (1, 8, 8))
    opt = torch.optim.Adam(model.parameters(), lr=row.lr)
    start = time.perf_counter()
    sdk.private_training(
        model,
        opt,
        (xr, yr),
        loss_fn=lambda out, y, reduction: loss_of(row.model, out, y, reduction),
        target_epsilon=row.epsilon,
        target_delta=DELTA,
        steps=row.steps,
        max_grad_norm=row.clip,
        loss_bound=None,  # Opacus's loop releases no loss either
        progress=False,
    ).fit()
    seconds = time.perf_counter() - start
    return model, seconds, client.budget().spent_epsilon


def train_opacus(
    row: Row, x: np.ndarray, y: np.ndarray, seed: int, *, guarantee: str = "add/remove"
) -> tuple[torch.nn.Module, float, float]:
    """Opacus at the row's (epsilon, delta) between datasets that differ by adding or removing
    a row (its own neighbours), or, with ``guarantee="replace-one"``, at the dpnode guarantee:
    ``(epsilon / 2, delta / (1 + e^(epsilon / 2)))`` for adding or removing, which is
    ``(epsilon, delta)`` for replacing (a removal, then an addition)."""
    from opacus import PrivacyEngine

    epsilon, delta = row.epsilon, DELTA
    if guarantee == "replace-one":
        epsilon, delta = epsilon / 2, delta / (1 + math.exp(epsilon / 2))

    torch.manual_seed(seed)
    features = tuple(x.shape[1:]) if row.data != "digits" else (1, 8, 8)
    model = make_model(row.model, features)
    xt = torch.from_numpy(x if row.data != "digits" else x[:, None])
    data = torch.utils.data.TensorDataset(xt, torch.from_numpy(y))
    loader = torch.utils.data.DataLoader(data, batch_size=row.batch)
    opt = torch.optim.SGD(model.parameters(), lr=row.opacus_lr)
    generator = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "secure RNG turned off": its default, as benchmarked
        engine = PrivacyEngine(accountant="rdp")
        model, opt, loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=opt,
            data_loader=loader,
            target_epsilon=epsilon,
            target_delta=delta,
            epochs=row.epochs,
            max_grad_norm=row.opacus_clip,
            noise_generator=generator,
        )
        start = time.perf_counter()
        for _ in range(row.epochs):
            for xb, yb in loader:
                if len(yb) == 0:
                    continue
                opt.zero_grad()
                loss_of(row.model, model(xb), yb).backward()
                opt.step()
        seconds = time.perf_counter() - start
    return model._module, seconds, float(engine.get_epsilon(delta))


def _mean_sd(v: list[float]) -> str:
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.mean(v):.3f} ± {sd:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rows", default="", help="comma-separated models to run (default all)")
    parser.add_argument("--quick", action="store_true", help="one seed, a quarter of the steps")
    args = parser.parse_args()
    rows = [r for r in ROWS if not args.rows or r.model in args.rows.split(",")]
    seeds = 1 if args.quick else args.seeds
    torch.set_num_threads(1)  # both sides on one core: the machine is shared
    print(f"{seeds} seeds; delta {DELTA:g}; accuracy mean ± sd on the held-out 20%\n")
    print(
        "| row | dpnode accuracy | Opacus accuracy | Opacus, replace-one | "
        "dpnode epsilon (ledger) | Opacus epsilon | dpnode s | Opacus s | time ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, in_process_node(Path(tmp)) as login:
        for k, row in enumerate(rows):
            if args.quick:
                row = Row(**{**row.__dict__, "steps": max(row.steps // 4, 2), "epochs": 5})
            acc_d, acc_o, acc_r, eps_d, eps_o, t_d, t_o = [], [], [], [], [], [], []
            for seed in range(seeds):
                x, y, _ = load(row.data)
                perm = np.random.default_rng(seed).permutation(len(y))
                cut = int(0.8 * len(y))
                tr, te = perm[:cut], perm[cut:]
                model, seconds, spent = train_dpnode(login, row, x[tr], y[tr], seed, f"r{k}s{seed}")
                test_x = x[te] if row.data != "digits" else x[te][:, None]
                acc_d.append(accuracy(row.model, model, test_x, y[te]))
                t_d.append(seconds)
                eps_d.append(spent)
                model, seconds, spent = train_opacus(row, x[tr], y[tr], seed)
                acc_o.append(accuracy(row.model, model, test_x, y[te]))
                t_o.append(seconds)
                eps_o.append(spent)
                model, _, _ = train_opacus(row, x[tr], y[tr], seed, guarantee="replace-one")
                acc_r.append(accuracy(row.model, model, test_x, y[te]))
            ratio = statistics.mean(t_d) / statistics.mean(t_o)
            print(
                f"| {row.name} | {_mean_sd(acc_d)} | {_mean_sd(acc_o)} | {_mean_sd(acc_r)} | "
                f"{max(eps_d):.3f} | "
                f"{max(eps_o):.3f} | {statistics.mean(t_d):.2f} | {statistics.mean(t_o):.2f} | "
                f"{ratio:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
