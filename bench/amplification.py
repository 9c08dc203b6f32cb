"""Where private training's noise comes from: subsampling, the neighbour relation, the filter.

    python -m bench.amplification [--rows 1149] [--batch 128] [--epochs 30]

For a run of ``T`` steps at a total ``(epsilon, delta = 1e-5)`` it prints the noise each
step adds to each coordinate of the *mean* clipped gradient, in units of the clipping bound
``C``, under five accountings of the same run, and its ratio to Opacus's:

* **Opacus**: Poisson sampling of expected batch ``B``, neighbours that add or remove a row,
  its RDP accountant (``get_noise_multiplier``): ``sigma C / B``.
* **full batch, add/remove**: every row each step, ``T`` Gaussian steps composed in zCDP and
  converted once (Canonne, Kamath & Steinke): ``C sqrt(T / (2 rho)) / n``.
* **full batch, replace-one**: the same for neighbours that replace a row (dpnode's): the
  sum of clipped gradients moves by ``2C``.
* **dpnode**: the same again, converted by the node's privacy filter, which is sound under
  fully adaptive composition (``dpnode.core.dp.accounting.spent``).
* **dpnode, a run held at one order**: the same run under a filter held at the one Rényi order
  its plan fixes (``dpnode.core.dp.run_accounting``, Theorem 4 of ``docs/privacy.md``): no
  union over the budget filter's 21 orders, the run owning the whole delta.
* **fixed-size sampling, replace-one**: a secret batch of exactly ``B`` rows drawn without
  replacement, the subsampled Gaussian's RDP (Wang, Balle & Kasiviswanathan 2019, as
  ``dp_accounting`` computes it) converted once.
* **Poisson sampling, replace-one (PLD)**: a secret Poisson batch of expected size ``B``,
  accounted by ``dp_accounting``'s privacy loss distribution for replacement (the pair
  ``(1-q) N(0) + q N(-C)`` against ``(1-q) N(0) + q N(C)``): what secret sampling on the node
  could buy, if the node's noise were the continuous Gaussian that accountant models.

``T`` is Opacus's step count, ``epochs * n / B``. The point of the table: at the same number
of steps full-batch descent already matches Poisson sampling's noise (subsampling pays for its
smaller batches with its amplification, to first order), so the gap to Opacus at epsilon 1 is
the neighbour relation (2x) and the filter's price for adaptivity. Secret Poisson sampling with
the tight accountant for replacement would remove the filter's price and a little more (1.80x
Opacus's noise at epsilon 1 against the node's 2.37x), not the neighbour relation's factor.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable

from dpnode.core.dp import accounting, run_accounting

DELTA = 1e-5


def _largest(fits: Callable[[float], bool], lo: float, hi: float) -> float:
    """The largest x in [lo, hi] with fits(x) (fits monotone decreasing), by bisection."""
    for _ in range(48):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _smallest(fits: Callable[[float], bool], lo: float, hi: float) -> float:
    """The smallest x in [lo, hi] with fits(x) (fits monotone increasing), by bisection."""
    for _ in range(24):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def noise_table(n: int, batch: int, epochs: int, epsilon: float) -> dict[str, float]:
    """Noise per coordinate of the mean clipped gradient, in units of C, per accounting."""
    from dp_accounting import dp_event, privacy_accountant
    from dp_accounting.pld import pld_privacy_accountant as pld
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    from opacus.accountants.utils import get_noise_multiplier

    steps = int(epochs * n / batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sigma = get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=DELTA,
            sample_rate=batch / n,
            epochs=epochs,
            accountant="rdp",
        )
    rho_cks = _largest(lambda r: accounting.zcdp_to_dp_cks(r, delta=DELTA) <= epsilon, 1e-9, 1e3)
    rho_filter = _largest(
        lambda r: (
            accounting.spent([accounting.Charge(rho=r)], epsilon=1e9, delta=DELTA)[0] <= epsilon
        ),
        1e-9,
        1e3,
    )
    rho_run = (
        steps
        * run_accounting.allocate(epsilon=epsilon, delta=DELTA, steps=steps, values=1).step_rho
    )
    orders = [1 + 2.0**j for j in range(-4, 7)] + list(range(2, 65))

    def wor_epsilon(noise: float) -> float:
        acct = rdp.RdpAccountant(orders, privacy_accountant.NeighboringRelation.REPLACE_ONE)
        gaussian = dp_event.GaussianDpEvent(noise)  # noise / (2C): the sensitivity here
        acct.compose(dp_event.SampledWithoutReplacementDpEvent(n, batch, gaussian), steps)
        return float(acct.get_epsilon(DELTA))

    wor = _smallest(lambda s: wor_epsilon(s) <= epsilon, 0.3, 300.0)

    def poisson_epsilon(noise: float) -> float:
        # dp_accounting's privacy loss distribution for Poisson sampling under replacement:
        # (1-q) N(0, s^2) + q N(-1, s^2) against (1-q) N(0, s^2) + q N(1, s^2), in units of C.
        acct = pld.PLDAccountant(
            privacy_accountant.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
        )
        gaussian = dp_event.GaussianDpEvent(noise)
        acct.compose(dp_event.PoissonSampledDpEvent(batch / n, gaussian), steps)
        return float(acct.get_epsilon(DELTA))

    poisson = _smallest(lambda s: poisson_epsilon(s) <= epsilon, 0.3, 300.0)
    per_step = math.sqrt(steps)
    return {
        "Opacus (Poisson, add/remove)": sigma / batch,
        "full batch, add/remove": per_step / math.sqrt(2 * rho_cks) / n,
        "full batch, replace-one": 2 * per_step / math.sqrt(2 * rho_cks) / n,
        "dpnode (full batch, replace-one, filter)": 2 * per_step / math.sqrt(2 * rho_filter) / n,
        "dpnode, a run held at one order": 2 * per_step / math.sqrt(2 * rho_run) / n,
        "fixed-size sampling, replace-one": 2 * wor / batch,
        "Poisson sampling, replace-one (PLD)": poisson / batch,
        "steps": float(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1149, help="training rows (digits: 1149)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    print(
        f"n = {args.rows}, batch {args.batch}, {args.epochs} epochs, delta {DELTA:g}: noise per "
        "coordinate of the mean gradient, in units of C (ratio to Opacus)\n"
    )
    tables = {e: noise_table(args.rows, args.batch, args.epochs, e) for e in (1.0, 8.0)}
    steps = int(tables[1.0].pop("steps"))
    tables[8.0].pop("steps")
    print(f"| accounting ({steps} steps) | epsilon 1 | epsilon 8 |")
    print("|---|---|---|")
    for name in tables[1.0]:
        cells = []
        for e in (1.0, 8.0):
            base = tables[e]["Opacus (Poisson, add/remove)"]
            cells.append(f"{tables[e][name]:.4f} ({tables[e][name] / base:.2f}x)")
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
