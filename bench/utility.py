"""Private training against Opacus: test accuracy at the same guarantee, and wall time.

    python -m bench.utility [--seeds 5] [--rows logistic,mlp] [--splits seed,fixed] [--quick]
                            [--epsilons 1,8] [--average none,ema,tail]

Each row trains one model on a scikit-learn dataset to a total ``epsilon`` at ``delta = 1e-5``
for neighbours that **replace one row** (dpnode's privacy unit: row counts are public), on
both sides, and tests it on held-out rows. Two train/test splits, 80/20, each row on both:

* ``seed``: a permutation drawn from the seed (a new split for every seed). The settings of
  both sides were chosen on a validation split of *these training rows* (``ROWS``).
* ``fixed``: scikit-learn's stratified ``train_test_split`` with ``random_state=SPLIT_SEED``,
  the same for every seed, on which nothing was chosen.

The sides, in the same run:

* **dpnode**: the training rows are uploaded to an in-process node (the real app, SQLite, the
  SDK over its transport); a fresh data scientist, whose allowance is exactly
  ``(epsilon, 1e-5)``, trains with ``sdk.private_training(...)`` (full-batch DP-GD: every
  step clips each row's gradient and adds Gaussian noise for ``2C``; the per-step noise
  planned so that the node's filter counts the run at most ``epsilon``). The epsilon shown
  is the node's ledger (``client.budget()``), not this script's arithmetic.
* **Opacus** (1.6, local): Poisson sampling of expected batch ``batch``, ``epochs`` epochs,
  SGD, the same model and initialisation; its noise multiplier is the smallest for which
  ``dp_accounting``'s privacy loss distribution accountant, for Poisson-sampled Gaussian steps
  between datasets that differ by *replacing* a row, gives ``(epsilon, delta)``
  (``make_private(noise_multiplier=...)``), and the epsilon shown is that accountant's.
  For information, one more column trains Opacus at its own neighbours (adding or removing
  a row: ``make_private_with_epsilon``, RDP), a weaker guarantee at the same numbers.

``--average`` trains dpnode's side once for each average of the iterates named (``none`` is
the last iterate; by default, ``sdk.private_training``'s default), each against the same
Opacus runs, one line each.

The verdict: ``level`` when dpnode's mean accuracy is at least Opacus's less one of Opacus's
standard deviations and dpnode's standard deviation at most 1.5 times Opacus's.

Features are scaled into [0, 1] by public bounds (breast cancer: each column's range over the
whole dataset, declared as the contract; digits: grey levels 0-16), which Opacus's settings
were chosen for. dpnode's side then maps them into [-1, 1] by their public ranges, as its docs
advise (``sdk.bounds_scaler``; ``sdk.logistic_regression`` does it itself): on its
validation rows that is worth 0.1 to the digits MLP at epsilon 1, and Opacus, at its
settings, loses by it (0.65 against 0.71). Time is the whole
training run (for dpnode: recording, HTTP, tracking, evaluation and noise of every step; for
Opacus: its data loader, hooks and optimizer), without the upload and the accuracy check.
"""

from __future__ import annotations

import argparse
import functools
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.services import users
from dpnode.node.settings import Settings

DELTA = 1e-5
#: the second split's seed (scikit-learn's ``random_state``): no setting was chosen on it
SPLIT_SEED = 20_251
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
#: dpnode's digits rows were checked again with centred features (docs/performance.md): the
#: MLP over lr {0.01 .. 0.1}, bound {0.1 .. 1}, steps {40, 80, 120}; the CNN at 8 over lr
#: {0.03, 0.1, 0.2} and bound {0.3, 1}. The logistic rows use sdk.logistic_regression's own.
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


def features(row: Row, x: np.ndarray) -> tuple[int, ...]:
    """One example's shape as the model sees it (digits: one channel of 8 x 8)."""
    return (1, 8, 8) if row.data == "digits" else tuple(x.shape[1:])


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
def in_process_node(
    data_dir: Path, url: str = "http://bench"
) -> Iterator[Callable[[str], sdk.Client]]:
    """A node with an admin, in process, known as ``url``; yields a login function."""
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
    # the SDK's in-process transport: the app on one event-loop thread, as a notebook would
    # open a node of its own (sdk.InProcessTransport)
    with sdk.InProcessTransport(create_app(context=context)) as transport:
        yield lambda email: sdk.login(url, email=email, password=PASSWORD, transport=transport)
    context.close()


def train_dpnode(
    login: Callable[[str], sdk.Client],
    row: Row,
    x: np.ndarray,
    y: np.ndarray,
    seed: int,
    run: str,
    average: dict[str, str | None],
) -> tuple[torch.nn.Module, float, float]:
    """Upload, allocate, train; returns the model, the seconds and the ledger's epsilon.
    ``average``: ``{"average": ...}`` to choose the iterates' average, or ``{}`` for the
    SDK's default."""
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
    model = make_model(row.model, features(row, x))
    if row.model == "logistic":  # what sdk offers for it, at its defaults
        start = time.perf_counter()
        fit = sdk.logistic_regression(xr, yr, epsilon=row.epsilon, progress=False, **average)
        seconds = time.perf_counter() - start
        assert isinstance(model, torch.nn.Linear)
        with torch.no_grad():
            model.weight.copy_(fit.coef.reshape(1, -1))
            model.bias.fill_(fit.intercept)
        return model, seconds, client.budget().spent_epsilon
    opt = torch.optim.Adam(model.parameters(), lr=row.lr)
    start = time.perf_counter()
    # as docs/remote-tensors.md advises: features centred by their public ranges
    scaler = sdk.bounds_scaler(xr)
    sdk.private_training(
        model,
        opt,
        (scaler(xr), yr),
        loss_fn=lambda out, y, reduction: loss_of(row.model, out, y, reduction),
        target_epsilon=row.epsilon,
        target_delta=DELTA,
        steps=row.steps,
        max_grad_norm=row.clip,
        loss_bound=None,  # Opacus's loop releases no loss either
        progress=False,
        **average,
    ).fit()
    seconds = time.perf_counter() - start
    return Scaled(model, scaler), seconds, client.budget().spent_epsilon


class Scaled(torch.nn.Module):
    """A model trained on scaled features, applied to unscaled ones (the test rows)."""

    def __init__(self, model: torch.nn.Module, scaler: sdk.BoundsScaler) -> None:
        super().__init__()
        self.model, self.scaler = model, scaler

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(self.scaler(x))
        return out


def opacus_sample(row: Row, rows: int) -> tuple[float, int]:
    """Opacus's Poisson sample rate and step count for ``rows`` training rows: its data
    loader draws ``len(loader) = ceil(rows / batch)`` batches an epoch, each row in each with
    probability ``1 / len(loader)``."""
    batches = math.ceil(rows / row.batch)
    return 1.0 / batches, row.epochs * batches


@functools.cache
def replace_one_noise(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier (to 0.1%) whose ``steps`` Poisson-sampled Gaussian steps
    are ``(epsilon, delta)``-DP for neighbours that *replace* a row, by ``dp_accounting``'s
    privacy loss distribution (the pair ``(1-q) N(0) + q N(-C)`` against ``(1-q) N(0) + q N(C)``
    in each step: the replaced row is in the batch or not, with clipped gradients ``-C`` and
    ``C`` apart)."""
    lo, hi = 0.1, 200.0
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (
            (lo, mid)
            if replace_one_epsilon(mid, delta, sample_rate, steps) <= epsilon
            else (mid, hi)
        )
    return hi


def replace_one_epsilon(noise: float, delta: float, sample_rate: float, steps: int) -> float:
    """Epsilon at ``delta`` of Opacus's run for neighbours that replace a row (PLD)."""
    from dp_accounting import dp_event, privacy_accountant
    from dp_accounting.pld import pld_privacy_accountant as pld

    acct = pld.PLDAccountant(
        privacy_accountant.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
    )
    step = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise))
    acct.compose(step, steps)
    return float(acct.get_epsilon(delta))


def train_opacus(
    row: Row, x: np.ndarray, y: np.ndarray, seed: int, *, guarantee: str = "replace-one"
) -> tuple[torch.nn.Module, float, float]:
    """Opacus at the row's ``(epsilon, delta)``; returns the model, the seconds and the epsilon
    its accountant reports.

    ``guarantee="replace-one"`` (dpnode's neighbours): the noise multiplier is the smallest
    whose run is ``(epsilon, delta)``-DP for replacing a row, by ``dp_accounting``'s PLD
    accountant (:func:`replace_one_noise`), and the epsilon reported is that accountant's.
    ``"add/remove"`` (Opacus's own neighbours): ``make_private_with_epsilon`` with its RDP
    accountant, for information."""
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    model = make_model(row.model, features(row, x))
    xt = torch.from_numpy(x if row.data != "digits" else x[:, None])
    data = torch.utils.data.TensorDataset(xt, torch.from_numpy(y))
    loader = torch.utils.data.DataLoader(data, batch_size=row.batch)
    opt = torch.optim.SGD(model.parameters(), lr=row.opacus_lr)
    generator = torch.Generator().manual_seed(seed)
    sample_rate, steps = opacus_sample(row, len(y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "secure RNG turned off": its default, as benchmarked
        engine = PrivacyEngine(accountant="rdp")
        if guarantee == "replace-one":
            noise = replace_one_noise(row.epsilon, DELTA, sample_rate, steps)
            model, opt, loader = engine.make_private(
                module=model,
                optimizer=opt,
                data_loader=loader,
                noise_multiplier=noise,
                max_grad_norm=row.opacus_clip,
                noise_generator=generator,
            )
        else:
            model, opt, loader = engine.make_private_with_epsilon(
                module=model,
                optimizer=opt,
                data_loader=loader,
                target_epsilon=row.epsilon,
                target_delta=DELTA,
                epochs=row.epochs,
                max_grad_norm=row.opacus_clip,
                noise_generator=generator,
            )
        start = time.perf_counter()
        taken = 0
        for _ in range(row.epochs):
            for xb, yb in loader:
                taken += 1
                if len(yb) == 0:
                    continue
                opt.zero_grad()
                loss_of(row.model, model(xb), yb).backward()
                opt.step()
        seconds = time.perf_counter() - start
    assert taken == steps, (taken, steps)  # the accountant counted the steps taken
    if guarantee == "replace-one":
        return model._module, seconds, replace_one_epsilon(noise, DELTA, sample_rate, steps)
    return model._module, seconds, float(engine.get_epsilon(DELTA))


def splits(name: str, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and test rows of the split ``name``: ``"seed"``, 80/20 by a permutation drawn
    from the seed (the split the settings were chosen on, with a validation split of its
    training rows); ``"fixed"``, scikit-learn's stratified 80/20 split by ``SPLIT_SEED``, the
    same for every seed, which no setting was chosen on."""
    if name == "seed":
        perm = np.random.default_rng(seed).permutation(len(y))
        cut = int(0.8 * len(y))
        return perm[:cut], perm[cut:]
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(
        np.arange(len(y)), test_size=0.2, stratify=y, random_state=SPLIT_SEED
    )
    return np.asarray(train), np.asarray(test)


def _mean_sd(v: list[float]) -> tuple[float, float]:
    return statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0


def _shown(v: list[float]) -> str:
    mean, sd = _mean_sd(v)
    return f"{mean:.3f} ± {sd:.3f}"


def verdict(dpnode: list[float], opacus: list[float]) -> str:
    """``level`` when dpnode's mean accuracy is at least Opacus's less one of Opacus's standard
    deviations and dpnode's standard deviation is at most 1.5 times Opacus's; otherwise what
    fails. ``-`` with one seed.

    >>> verdict([0.90, 0.92], [0.91, 0.93])
    'level'
    >>> verdict([0.80, 0.82], [0.91, 0.93])
    'behind'
    >>> verdict([0.85, 0.99], [0.91, 0.93])
    'spread'
    """
    if len(dpnode) < 2:
        return "-"
    (md, sd), (mo, so) = _mean_sd(dpnode), _mean_sd(opacus)
    failed = [w for w, bad in (("behind", md < mo - so), ("spread", sd > 1.5 * so)) if bad]
    return " and ".join(failed) or "level"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rows", default="", help="comma-separated models to run (default all)")
    parser.add_argument("--splits", default="seed,fixed", help="which splits (default both)")
    parser.add_argument("--quick", action="store_true", help="one seed, a quarter of the steps")
    parser.add_argument("--epsilons", default="", help="comma-separated epsilons (default all)")
    parser.add_argument(
        "--average",
        default="",
        help="dpnode's averages of the iterates to compare: none, ema, tail (default: the SDK's)",
    )
    args = parser.parse_args()
    rows = [r for r in ROWS if not args.rows or r.model in args.rows.split(",")]
    if args.epsilons:
        rows = [r for r in rows if r.epsilon in {float(e) for e in args.epsilons.split(",")}]
    averages: list[dict[str, str | None]] = [
        {"average": None if a == "none" else a} for a in args.average.split(",") if a
    ] or [{}]
    seeds = 1 if args.quick else args.seeds
    torch.set_num_threads(1)  # both sides on one core: the machine is shared
    print(
        f"{seeds} seeds; delta {DELTA:g}; neighbours replace one row on both sides; "
        "accuracy mean ± sd on the held-out 20%\n"
    )
    print(
        "| row | split | dpnode accuracy | Opacus accuracy | verdict | dpnode epsilon (ledger) "
        "| Opacus epsilon (PLD) | Opacus, add/remove | dpnode s | Opacus s | time ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, in_process_node(Path(tmp)) as login:
        for k, row in enumerate(rows):
            if args.quick:
                row = Row(**{**row.__dict__, "steps": max(row.steps // 4, 2), "epochs": 5})
            x, y, _ = load(row.data)
            for split in args.splits.split(","):
                acc_o, acc_a, eps_o, t_o = [], [], [], []
                acc_d: list[list[float]] = [[] for _ in averages]
                eps_d: list[list[float]] = [[] for _ in averages]
                t_d: list[list[float]] = [[] for _ in averages]
                for seed in range(seeds):
                    tr, te = splits(split, y, seed)
                    test_x = x[te] if row.data != "digits" else x[te][:, None]
                    for j, average in enumerate(averages):
                        run = f"r{k}{split}s{seed}a{j}"
                        model, seconds, spent = train_dpnode(
                            login, row, x[tr], y[tr], seed, run, average
                        )
                        acc_d[j].append(accuracy(row.model, model, test_x, y[te]))
                        t_d[j].append(seconds)
                        eps_d[j].append(spent)
                    model, seconds, spent = train_opacus(row, x[tr], y[tr], seed)
                    acc_o.append(accuracy(row.model, model, test_x, y[te]))
                    t_o.append(seconds)
                    eps_o.append(spent)
                    model, _, _ = train_opacus(row, x[tr], y[tr], seed, guarantee="add/remove")
                    acc_a.append(accuracy(row.model, model, test_x, y[te]))
                for j, average in enumerate(averages):
                    name = row.name
                    if average:
                        name += f", average {average['average'] or 'none'}"
                    ratio = statistics.mean(t_d[j]) / statistics.mean(t_o)
                    cells = [
                        name,
                        split,
                        _shown(acc_d[j]),
                        _shown(acc_o),
                        verdict(acc_d[j], acc_o),
                        f"{max(eps_d[j]):.3f}",
                        f"{max(eps_o):.3f}",
                        _shown(acc_a),
                        f"{statistics.mean(t_d[j]):.2f}",
                        f"{statistics.mean(t_o):.2f}",
                        f"{ratio:.1f}x",
                    ]
                    print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
