"""Run torch's OpInfo samples through remote tensors and the engine; compare with torch eager.

Each sample's tensors become remote inputs; the op runs on them exactly as a
user would call it (``op(input, *args, **kwargs)``), the recorded graph is
evaluated by the node's engine on the sample's values, and every output must
match torch in shape, dtype and value (torch's default tolerances). Outcomes:

- ``pass``: all outputs match, or torch refuses the sample and so do we;
- ``value_dependent``: torch's own FakeTensorMode says the output shape (or a
  Python value) depends on the data: excluded from the target, and we must
  raise PrivateValueError for it;
- ``unsupported``: UnsupportedOperationError (no decomposition into prims);
- ``wrong``: a shape, dtype or value differs from torch (a defect);
- ``error``: anything else raised while recording or evaluating.

``python -m tests.sdk.opinfo_sweep`` prints the table quoted in
docs/remote-tensors.md.
"""

from __future__ import annotations

import collections
import re
import sys
import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._pytree import tree_flatten, tree_map

from dpnode import sdk
from dpnode.sdk._remote import evaluate, remote_input
from dpnode.sdk._remote.graph import TORCH_NAMES

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

DTYPES = (torch.float32, torch.int64)
MAX_SAMPLES = 3
TOLERANCES = {
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-5),
}

#: entries whose values are random or uninitialised: shape and dtype are compared, values not
#: (svd_lowrank/pca_lowrank project on random Gaussian matrices: torch's own result
#: changes with the seed, and the node draws from its own generator)
RANDOM = re.compile(
    r"empty|dropout|bernoulli|cauchy|exponential|geometric|log_normal|normal|uniform|rand"
    r"|multinomial|lowrank"
)
#: entries whose integer index outputs may order ties differently (values are compared)
TIES = {"sort", "argsort", "topk", "msort", "kthvalue", "mode", "median", "nanmedian"}

ENTRIES = {(o.name + ("." + o.variant_test_name if o.variant_test_name else "")): o for o in op_db}


def _value_dependent(op: Any, s: Any) -> bool:
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            conv = tree_map(
                lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
                (s.input, s.args, s.kwargs),
            )
            op(conv[0], *conv[1], **conv[2])
    except (DynamicOutputShapeException, DataDependentOutputException):
        return True
    except Exception:
        return False
    return False


def _remote(s: Any) -> tuple[Any, dict[str, Any]]:
    feed: dict[str, Any] = {}

    def conv(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dtype in TORCH_NAMES and t.device.type == "cpu":
            name = f"t{len(feed)}"
            feed[name] = t.detach().contiguous().numpy().copy()
            return remote_input(name, tuple(t.shape), t.dtype)
        return t

    return tree_map(conv, (s.input, s.args, s.kwargs)), feed


def _close(g: torch.Tensor, e: torch.Tensor) -> bool:
    if g.shape != e.shape or g.dtype != e.dtype:
        return False
    if e.dtype in TOLERANCES:
        rtol, atol = TOLERANCES[e.dtype]
        return bool(torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True).all())
    return bool(torch.equal(g, e))


def check_sample(op: Any, s: Any, name: str = "") -> tuple[str, str]:
    """(outcome, detail) for one sample."""
    try:
        expected = op(s.input, *s.args, **s.kwargs)
        torch_error: Exception | None = None
    except Exception as e:  # torch refuses: so must we
        expected, torch_error = None, e
    vdep = torch_error is None and _value_dependent(op, s)
    try:
        (inp, args, kwargs), feed = _remote(s)
        out = op(inp, *args, **kwargs)
        outs, _ = tree_flatten(out)
        remote_outs = [o for o in outs if isinstance(o, torch.Tensor)]
        escaped = [
            o
            for o in remote_outs
            if not isinstance(o, sdk.RemoteTensor) and o.device.type == "meta"
        ]
        if escaped and not vdep:
            return "error", "a value-less meta tensor escaped the recording"
        got = evaluate(remote_outs, feed)
    except sdk.PrivateValueError as e:
        if vdep:
            return "value_dependent", ""
        return ("pass", "") if torch_error else ("error", f"PrivateValueError: {str(e)[:100]}")
    except sdk.UnsupportedOperationError as e:
        if torch_error:
            return "pass", ""
        return ("value_dependent", "") if vdep else ("unsupported", str(e)[:120])
    except Exception as e:
        if torch_error:
            return "pass", ""
        return ("value_dependent", "") if vdep else ("error", f"{type(e).__name__}: {str(e)[:160]}")
    if torch_error:
        return "wrong", f"torch raised {type(torch_error).__name__} but the remote op computed"
    exp, _ = tree_flatten(expected)
    exp_t = [e for e in exp if isinstance(e, torch.Tensor)]
    if len(exp_t) != len(got):
        return "wrong", f"{len(got)} outputs, torch has {len(exp_t)}"
    random = (
        RANDOM.search(name) is not None
        or s.kwargs.get("dropout_p", 0) > 0
        or s.kwargs.get("training") is True
    )
    for k, (r, g) in enumerate(zip(remote_outs, got, strict=True)):
        if isinstance(r, sdk.RemoteTensor) and (
            tuple(r.shape) != tuple(g.shape) or r.dtype != g.dtype
        ):
            return (
                "wrong",
                f"output {k}: the client inferred {r.dtype}{list(r.shape)}, "
                f"the node {g.dtype}{list(g.shape)}",
            )
    for k, (g, e) in enumerate(zip(got, exp_t, strict=True)):
        if random or (name in TIES and e.dtype == torch.int64 and k > 0):
            if g.shape != e.shape or g.dtype != e.dtype:
                return (
                    "wrong",
                    f"output {k}: got {g.dtype}{list(g.shape)}, torch {e.dtype}{list(e.shape)}",
                )
            continue
        if not _close(g, e):
            return (
                "wrong",
                f"output {k}: got {g.dtype}{list(g.shape)}, torch {e.dtype}{list(e.shape)}",
            )
    return "pass", ""


def check_entry(name: str, dtype: torch.dtype) -> tuple[str, str] | None:
    """The entry's outcome for one dtype: the worst of its samples (None: dtype unsupported)."""
    op = ENTRIES[name]
    if dtype not in op.supported_dtypes("cpu"):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]
        except Exception as e:  # pragma: no cover - OpInfo's own problem
            return "error", f"sample_inputs: {e}"
        order = ["wrong", "error", "unsupported", "value_dependent", "pass"]
        worst = ("pass", "")
        for s in samples:
            res = check_sample(op, s, name)
            if order.index(res[0]) < order.index(worst[0]):
                worst = res
    return worst


def sweep(names: list[str] | None = None) -> dict[tuple[str, str], tuple[str, str]]:
    """Every (entry, dtype) outcome."""
    results: dict[tuple[str, str], tuple[str, str]] = {}
    for name in names or sorted(ENTRIES):
        for d in DTYPES:
            torch.manual_seed(0)
            r = check_entry(name, d)
            if r is not None:
                results[(name, TORCH_NAMES[d])] = r
    return results


def summary(results: dict[tuple[str, str], tuple[str, str]]) -> str:
    """Counts per dtype and overall, and the pass rate against the 90% target."""
    lines = [
        "| dtype | pass | unsupported | error | wrong | value-dependent (excluded) | pass rate |",
        "|---|---|---|---|---|---|---|",
    ]
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (_, d), (outcome, _) in results.items():
        per[d][outcome] += 1
        per["all"][outcome] += 1
    for d in [*(TORCH_NAMES[t] for t in DTYPES), "all"]:
        c = per[d]
        counted = sum(c.values()) - c["value_dependent"]
        rate = 100.0 * c["pass"] / counted if counted else 0.0
        cells = [
            d,
            *(str(c[k]) for k in ("pass", "unsupported", "error", "wrong", "value_dependent")),
        ]
        lines.append("| " + " | ".join([*cells, f"{rate:.1f}%"]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    res = sweep(sys.argv[1:] or None)
    print(summary(res))
    for (name, d), (outcome, detail) in sorted(res.items()):
        if outcome not in ("pass", "value_dependent"):
            print(f"{outcome:12} {d:8} {name}: {detail}")
