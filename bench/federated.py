"""Federated DP training over three nodes against the same run on the pooled rows: accuracy.

    python -m bench.federated [--seeds 5] [--rows softmax,mlp] [--quick]

Each seed splits a scikit-learn dataset 80/20 (``bench.utility.splits``, the ``seed`` split),
then deals the training rows at random to three sites: three in-process nodes, each with
its own database, its own data scientist and an allowance of exactly ``(epsilon, 1e-5)``.
Both sides train the same model from the same initialisation with ``sdk.private_training``
at ``bench.utility``'s settings for that row:

* **pooled**: one node holds every training row (``bench.utility.train_dpnode``);
* **federated**: each step, every site releases its own clipped gradient sum with its own
  noise, charged to its own run, and the client adds them over the pooled row count.

Each site's guarantee is ``epsilon`` for its own subjects, as the pooled node's is for all
of them; the federated gradient carries ``sqrt(3)`` times the pooled run's noise (three
independent releases of the same sensitivity), which is the price of no party seeing the
pooled rows. The verdict: ``level`` when the federated mean accuracy is within one standard
deviation (the pooled runs') of the pooled mean, ``behind`` otherwise. One more column trains
on the pooled rows at ``epsilon / sqrt(3)``, whose noise is about the federated run's: where
the federated run is behind, that column says whether the noise accounts for it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.utility import (
    DELTA,
    PASSWORD,
    ROWS,
    Row,
    Scaled,
    accuracy,
    features,
    in_process_node,
    load,
    loss_of,
    make_model,
    splits,
    train_dpnode,
)
from dpnode import sdk

SITES = 3


def train_federated(
    logins: list[Callable[[str], sdk.Client]],
    row: Row,
    parts: list[tuple[np.ndarray, np.ndarray]],
    seed: int,
    run: str,
) -> tuple[torch.nn.Module, float]:
    """Upload each site's rows, allocate, train across the sites; returns the model and the
    largest epsilon any site's ledger counts."""
    column = "image" if row.data == "digits" else "features"
    clients, data = [], []
    for login, (x, y) in zip(logins, parts, strict=True):
        admin, owner = login("admin@x.org"), login("owner@x.org")
        owner.upload_dataset(
            run, {column: x, "label": y}, bounds={column: (0.0, 1.0), "label": (0, 9)}
        )
        admin.set_policy(
            f"[roles.data_scientist]\nepsilon = {row.epsilon!r}\ndelta = {DELTA!r}\n", reason=run
        )
        admin.create_user(f"{run}@x.org", PASSWORD)
        clients.append(login(f"{run}@x.org"))
    handles = sdk.federated([c.dataset(run) for c in clients]).handles
    for ds in handles:
        xr, yr = ds.tensors(column, "label")
        data.append((xr.float().unsqueeze(1) if row.data == "digits" else xr, yr))
    scaler = sdk.bounds_scaler(data[0][0])  # the public ranges, the same at every site
    torch.manual_seed(seed)
    model = make_model(row.model, features(row, parts[0][0]))
    sdk.private_training(
        model,
        torch.optim.Adam(model.parameters(), lr=row.lr),
        [(scaler(xr), yr) for xr, yr in data],
        loss_fn=lambda out, y, reduction: loss_of(row.model, out, y, reduction),
        target_epsilon=row.epsilon,
        target_delta=DELTA,
        steps=row.steps,
        max_grad_norm=row.clip,
        loss_bound=None,
        progress=False,
    ).fit()
    return Scaled(model, scaler), max(c.budget().spent_epsilon for c in clients)


def _shown(v: list[float]) -> str:
    return f"{statistics.mean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rows", default="softmax,mlp", help="comma-separated models")
    parser.add_argument("--quick", action="store_true", help="one seed, a quarter of the steps")
    args = parser.parse_args()
    rows = [r for r in ROWS if r.model in args.rows.split(",") and r.data == "digits"]
    seeds = 1 if args.quick else args.seeds
    torch.set_num_threads(1)  # the machine is shared
    print(f"{seeds} seeds; {SITES} sites; delta {DELTA:g}; accuracy mean ± sd, held-out 20%\n")
    print(
        "| row | pooled accuracy | federated accuracy | verdict | epsilon (largest ledger) "
        f"| pooled at epsilon / sqrt({SITES}) |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        homes = [Path(tmp) / name for name in ["pooled", *(f"site-{k}" for k in range(SITES))]]
        for home in homes:
            home.mkdir()
        pooled_login, *logins = [
            stack.enter_context(in_process_node(h, f"http://{h.name}")) for h in homes
        ]
        for k, row in enumerate(rows):
            if args.quick:
                row = Row(**{**row.__dict__, "steps": max(row.steps // 4, 2)})
            x, y, _ = load(row.data)
            pooled, fed, spent, reduced = [], [], [], []
            reduced_row = Row(
                **{**row.__dict__, "epsilon": round(row.epsilon / math.sqrt(SITES), 3)}
            )
            for seed in range(seeds):
                tr, te = splits("seed", y, seed)
                test_x = x[te][:, None] if row.data == "digits" else x[te]
                run = f"r{k}s{seed}"
                model, _, _ = train_dpnode(pooled_login, row, x[tr], y[tr], seed, run)
                pooled.append(accuracy(row.model, model, test_x, y[te]))
                model, _, _ = train_dpnode(pooled_login, reduced_row, x[tr], y[tr], seed, run + "q")
                reduced.append(accuracy(row.model, model, test_x, y[te]))
                dealt = np.array_split(np.random.default_rng(seed).permutation(tr), SITES)
                parts = [(x[d], y[d]) for d in dealt]
                model, eps = train_federated(logins, row, parts, seed, run)
                fed.append(accuracy(row.model, model, test_x, y[te]))
                spent.append(eps)
            sd = statistics.stdev(pooled) if len(pooled) > 1 else 0.0
            level = statistics.mean(fed) >= statistics.mean(pooled) - sd
            cells = [
                row.name,
                _shown(pooled),
                _shown(fed),
                ("level" if level else "behind") if seeds > 1 else "-",
                f"{max(spent):.3f}",
                _shown(reduced),
            ]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
