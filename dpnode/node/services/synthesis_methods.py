"""The synthesis methods a request may name (:data:`METHODS`): how each plans from public
metadata, what it holds in memory at most, and how it runs once charged, reporting its
progress to its job. The order of events around them is :mod:`dpnode.node.services.synthesis`'s.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dpnode.core.dp import accounting
from dpnode.core.errors import EvaluationUnavailableError
from dpnode.core.synth import AimPlan, Attribute, MstPlan, plan_aim, plan_mst, run_aim, run_mst
from dpnode.core.synth.aim import Progress
from dpnode.core.synth.estimate import estimate_marginals, sample_model, sample_tree
from dpnode.node.services.synthesis_jobs import Reporter

__all__ = [
    "ESTIMATOR",
    "METHODS",
    "Method",
    "Plan",
    "Sampled",
    "aim_memory_bytes",
    "check_estimator",
    "memory_bytes",
]

#: The package that estimates and samples (post-processing), an optional dependency.
ESTIMATOR = "mbi"


class Plan(Protocol):
    """What both methods' plans offer the service."""

    @property
    def attributes(self) -> tuple[Attribute, ...]: ...
    @property
    def rows(self) -> int: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...
    def terms(self) -> accounting.Terms: ...


@dataclass(frozen=True)
class Sampled:
    """A run's synthetic codes and its utility report (public or post-processing only: the
    measured column sets, each one's noise, the rounds)."""

    codes: Any
    report: dict[str, Any]


@dataclass(frozen=True)
class Method:
    """A synthesis method: how it plans (public metadata), what it holds in memory at most,
    and how it runs once charged (the plan, the binned table, rows to sample, a generator
    for the sampling, where to report its progress); ``estimator``: whether it needs
    :data:`ESTIMATOR` installed."""

    plan: Callable[[tuple[Attribute, ...], int, float, float], Plan]
    memory: Callable[[Any, int], int]
    run: Callable[[Any, Any, int, np.random.Generator, Reporter], Sampled]
    estimator: bool


def memory_bytes(plan: MstPlan, rows_out: int) -> int:
    """What a run holds at most, from public sizes: the binned source and output tables,
    every marginal scored at once, and the estimate's copies of the tree's marginals (its
    potentials, marginals, gradients and line-search states, a dozen of them in float64).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 10, 0.0, 9.0, None) for n in "abc"]
    >>> memory_bytes(plan_mst(attrs, rows=100, epsilon=1.0, delta=1e-6), 100)
    26640
    """
    d = len(plan.attributes)
    tables = 8 * d * (plan.rows + rows_out)
    return tables + 8 * plan.cells + 96 * plan.largest_pair * max(d - 1, 0)


def aim_memory_bytes(plan: AimPlan, rows_out: int) -> int:
    """What an AIM run holds at most, from public sizes: the binned source and output tables,
    every candidate's true counts, and the estimate's copies of a model at its size limit
    (as :func:`memory_bytes` counts them).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 10, 0.0, 9.0, None) for n in "abc"]
    >>> aim_memory_bytes(plan_aim(attrs, rows=100, epsilon=1.0, delta=1e-6), 100)
    140240
    """
    d = len(plan.attributes)
    largest_model = min(plan.model_cells, sum(plan.size(c) for c in plan.workload))
    return 8 * d * (plan.rows + rows_out) + 8 * plan.cells + 96 * largest_model


def _names(plan: Plan, cliques: Sequence[Sequence[int]]) -> list[list[str]]:
    return [[plan.attributes[j].name for j in c] for c in cliques]


#: MST's steps as a job reports them: it measures, selects and measures its tree in one call.
_MST_STEPS = ("measuring", "estimating", "sampling", "storing")


def _run_mst(
    plan: MstPlan, codes: Any, rows: int, rng: np.random.Generator, report: Reporter
) -> Sampled:
    total = len(_MST_STEPS)
    report(0, total, "measuring")
    measured = run_mst(codes, plan)
    report(1, total, "estimating")
    sizes = [a.size for a in plan.attributes]
    if len(sizes) > 1:
        root, edges = estimate_marginals(plan.attributes, measured, plan.rows)
    else:  # one column: its noisy marginal is the model
        root, edges = measured.one_way[0], {}
    tree = _names(plan, measured.pairs)
    shown = {
        "selection_epsilon": plan.select_epsilon * plan.selections,
        "one_way_sigma": measured.one_way_sigma,
        "two_way_sigma": list(measured.two_way_sigma),
        "tree": tree,
        "rounds": len(measured.pairs),
        "measured": [
            *({"columns": [a.name], "sigma": measured.one_way_sigma} for a in plan.attributes),
            *(
                {"columns": names, "sigma": sigma}
                for names, sigma in zip(tree, measured.two_way_sigma, strict=True)
            ),
        ],
    }
    report(2, total, "sampling")
    synthetic = sample_tree(sizes, root, edges, rows, rng)
    report(3, total, "storing")
    return Sampled(synthetic, shown)


def _run_aim(
    plan: AimPlan, codes: Any, rows: int, rng: np.random.Generator, report: Reporter
) -> Sampled:
    # its rounds, then sampling and storing: a run that stops early jumps to sampling
    total = plan.max_rounds + 2

    def rounds(at: Progress) -> None:
        report(at.rounds, total, at.phase)

    run = run_aim(codes, plan, progress=rounds)
    assert run.model is not None  # every run ends with its full fit
    report(plan.max_rounds, total, "sampling")
    synthetic = sample_model(run.model, len(plan.attributes), rows, int(rng.integers(2**32)))
    report(plan.max_rounds + 1, total, "storing")
    shown = {
        "selection_epsilon": math.fsum(m.selection_epsilon for m in run.measurements),
        "rounds": run.rounds,
        "rounds_planned": plan.max_rounds,
        "workload": _names(plan, plan.workload),
        "measured": [
            {
                "columns": [plan.attributes[j].name for j in m.clique],
                "sigma": m.sigma,
                "selection_epsilon": m.selection_epsilon,
            }
            for m in run.measurements
        ],
    }
    return Sampled(synthetic, shown)


#: The methods a synthesis may name.
METHODS: dict[str, Method] = {
    "aim": Method(
        lambda attrs, rows, eps, delta: plan_aim(attrs, rows=rows, epsilon=eps, delta=delta),
        aim_memory_bytes,
        _run_aim,
        estimator=False,  # its own NumPy estimation
    ),
    "mst": Method(
        lambda attrs, rows, eps, delta: plan_mst(attrs, rows=rows, epsilon=eps, delta=delta),
        memory_bytes,
        _run_mst,
        estimator=True,
    ),
}


def check_estimator(method: str) -> None:
    """Refuse, before anything is charged, a method that needs ``mbi`` on a node without it."""
    needs = method in METHODS and METHODS[method].estimator
    if needs and importlib.util.find_spec(ESTIMATOR) is None:
        raise EvaluationUnavailableError(
            f"this node cannot synthesize with method={method!r}: its estimator (Private-PGM, "
            "the 'mbi' package) is not installed; ask its operator to pip install "
            "'dpnode[synth]', or use method='aim', which needs none. Nothing was charged",
            retry_after=3600,
        )
