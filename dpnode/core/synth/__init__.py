"""Differentially private synthetic data: MST's and AIM's private steps with the node's
mechanisms.

* :mod:`dpnode.core.synth.domain` — the finite domain from public metadata, binning;
* :mod:`dpnode.core.synth.mst` — the plan (budget split, what it charges) and the private
  measurements and selections;
* :mod:`dpnode.core.synth.aim` — AIM's plan (workload, candidates, what it charges) and its
  adaptive rounds of selections and measurements;
* :mod:`dpnode.core.synth.estimate` — Private-PGM's estimate and sampling (post-processing),
  importing ``mbi`` and JAX only when called.

See ``docs/synthetic.md``.
"""

from dpnode.core.synth.aim import AimPlan, AimRun, plan_aim, run_aim
from dpnode.core.synth.domain import Attribute, ColumnFacts, decode, domain_of, encode
from dpnode.core.synth.mst import Measured, MstPlan, plan_mst, run_mst

__all__ = [
    "AimPlan",
    "AimRun",
    "Attribute",
    "ColumnFacts",
    "Measured",
    "MstPlan",
    "decode",
    "domain_of",
    "encode",
    "plan_aim",
    "plan_mst",
    "run_aim",
    "run_mst",
]
