"""Run SmartNoise Synth's MST or AIM on binned codes: the peer side of bench/synthetic.py.

Runs under ``.venv-smartnoise`` (bench/smartnoise_env.sh), as a subprocess of the bench:

    .venv-smartnoise/bin/python bench/smartnoise_worker.py DIR

``DIR/input.npz`` holds ``codes`` (rows x columns of int64 codes) and ``sizes`` (each
column's number of codes); ``DIR/request.json`` holds ``method`` (``mst``/``aim``), ``rhos``
(the replace-one zCDP budgets to match), ``delta`` and ``seeds``. It writes
``DIR/output.npz``: ``synthetic_<i>_<seed>`` (codes for ``rhos[i]``, as many rows as the
input) and ``seconds`` (``rhos x seeds``: each fit and sample's wall time, all in this one
process, so that JAX compiles once per table as it does in the node's process), and
``DIR/result.json`` with the epsilons and delta handed to SmartNoise. Plain data files both
ways: nothing pickled.

The domain is declared, not learned: every column is a label column fitted on a public frame
that holds each of its codes, so SmartNoise spends nothing on preprocessing and sees the
same domain as the node (codes absent from the private table included).

SmartNoise calibrates for add/remove neighbours; the node for replace-one. A replacement is
a removal and an addition: a Gaussian count release's L2 sensitivity grows from 1 to sqrt(2)
(2x rho) and an exponential-mechanism score's from 1 to 2 (its ``eps^2 / 8`` bound, 4x rho).
MST spends thirds of its rho on 1-way marginals, selection and 2-way marginals: replace-one
rho = (2 + 4 + 2) / 3 = 8/3 of its add/remove rho. AIM spends a round's rho 0.9 on the
Gaussian and 0.1 on the selection (its first 1-way round is Gaussian only): at most
2 x 0.9 + 4 x 0.1 = 2.2 of it. So SmartNoise is given add/remove rho = rho / factor, as the
(epsilon, delta) that its own ``cdp_rho`` turns into that rho.

SmartNoise's Gaussian noise comes from OpenDP's sampler, which no seed reaches: the seed
fixes NumPy's global generator (its selections and sampling) only.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: replace-one rho / add-remove rho for each method (see the module docstring).
REPLACE_ONE_FACTOR = {"mst": 8 / 3, "aim": 2.2}


def epsilon_for(rho: float, delta: float) -> float:
    """The largest epsilon (to 1e-9 relative) whose ``cdp_rho(epsilon, delta)`` is at most
    ``rho``: SmartNoise takes (epsilon, delta) and converts it to rho itself."""
    from snsynth.utils import cdp_rho

    low, high = 0.0, 1.0
    while cdp_rho(high, delta) <= rho:
        low, high = high, high * 2
    while high - low > 1e-9 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if cdp_rho(mid, delta) <= rho else (low, mid)
    return low


def declared(sizes: list[int]) -> Any:
    """A fitted table transformer whose column ``j`` has the codes ``0 .. sizes[j] - 1``,
    fitted on a public frame of every code (no private value, no budget)."""
    import pandas as pd
    from snsynth.transform import LabelTransformer, TableTransformer

    width = max(sizes)
    frame = pd.DataFrame({f"c{j}": np.arange(width) % s for j, s in enumerate(sizes)})
    transformer = TableTransformer([LabelTransformer(nullable=False) for _ in sizes])
    transformer.fit(frame)
    return transformer


def synthesize(
    method: str, codes: np.ndarray, sizes: list[int], epsilon: float, delta: float, seed: int
) -> np.ndarray:
    import pandas as pd
    from snsynth.aim import AIMSynthesizer
    from snsynth.mst import MSTSynthesizer

    np.random.seed(seed)
    frame = pd.DataFrame({f"c{j}": codes[:, j] for j in range(codes.shape[1])})
    kind = {"mst": MSTSynthesizer, "aim": AIMSynthesizer}[method]
    synth = kind(epsilon=epsilon, delta=delta)
    synth.fit(frame, transformer=declared(sizes), preprocessor_eps=0.0)
    out = synth.sample(codes.shape[0])
    columns = [f"c{j}" for j in range(codes.shape[1])]
    return np.asarray(pd.DataFrame(out, columns=columns)[columns], dtype=np.int64)


def main(folder: Path) -> None:
    request = json.loads((folder / "request.json").read_text())
    with np.load(folder / "input.npz", allow_pickle=False) as data:
        codes, sizes = data["codes"].astype(np.int64), [int(s) for s in data["sizes"]]
    method, delta = request["method"], float(request["delta"])
    # imported before the clock starts, as the node's modules are
    import snsynth.aim
    import snsynth.mst  # noqa: F401

    epsilons = [epsilon_for(float(r) / REPLACE_ONE_FACTOR[method], delta) for r in request["rhos"]]
    outputs, seconds = {}, np.zeros((len(epsilons), len(request["seeds"])))
    for i, epsilon in enumerate(epsilons):
        for k, seed in enumerate(request["seeds"]):
            start = time.perf_counter()
            outputs[f"synthetic_{i}_{seed}"] = synthesize(
                method, codes, sizes, epsilon, delta, seed
            )
            seconds[i, k] = time.perf_counter() - start
    np.savez(folder / "output.npz", seconds=seconds, **outputs)
    (folder / "result.json").write_text(json.dumps({"epsilons": epsilons, "delta": delta}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
