"""The engine's conformance tallies against torch, and the tables printed from them.

The tests that fill them import torch and its OpInfo database; this module imports neither,
so that the process that prints the tables at the end of the session can hold them without
running those tests. Under pytest-xdist (``make test``) that process is the controller: each
worker fills its own tallies, hands them over when it finishes (``as_wire``), and the
controller adds them up (``merge``) before printing (the root ``conftest.py``).
"""

from __future__ import annotations

import collections
from typing import Any

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool")

Counts = dict[tuple[str, str], collections.Counter[str]]
Results = dict[str, collections.Counter[str]]

#: samples per (op, dtype) and outcome (pass / fail / skip / known): test_conformance.py
COUNTS: Counts = collections.defaultdict(collections.Counter)
#: cells per binary prim and outcome (match / both refuse / ...): test_promotion_matrix.py
RESULTS: Results = collections.defaultdict(collections.Counter)


def as_wire(counts: Counts, results: Results) -> dict[str, Any]:
    """Tallies as plain lists and dicts (what xdist carries from a worker to the controller).

    >>> as_wire({("sin", "float32"): collections.Counter(pass_=2)}, {})
    {'counts': [['sin', 'float32', {'pass_': 2}]], 'results': {}}
    """
    return {
        "counts": [[op, d, dict(c)] for (op, d), c in counts.items()],
        "results": {prim: dict(c) for prim, c in results.items()},
    }


def merge(wire: dict[str, Any], counts: Counts, results: Results) -> None:
    """Add another process's tallies (from ``as_wire``) to ``counts`` and ``results``.

    >>> counts = collections.defaultdict(collections.Counter)
    >>> merge({"counts": [["sin", "f32", {"pass": 2}]], "results": {}}, counts, {})
    >>> merge({"counts": [["sin", "f32", {"pass": 1, "fail": 1}]], "results": {}}, counts, {})
    >>> dict(counts[("sin", "f32")])
    {'pass': 3, 'fail': 1}
    """
    for op, d, counter in wire["counts"]:
        counts.setdefault((op, d), collections.Counter()).update(counter)
    for prim, counter in wire["results"].items():
        results.setdefault(prim, collections.Counter()).update(counter)


def _cell(c: collections.Counter[str] | None) -> str:
    """One op x dtype cell: passes, then F(ail)/K(nown)/S(kip) counts if any; '-' if untested."""
    if not c:
        return "-"
    extra = "".join(f" {k[0].upper()}{c[k]}" for k in ("fail", "known", "skip") if c[k])
    return f"{c['pass']}{extra}"


def summary_table() -> str:
    """Markdown tables: samples per op and dtype (with totals), then per dtype."""
    per_op: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    per_dtype: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (op, d), c in COUNTS.items():
        per_op[op].update(c)
        per_dtype[d].update(c)
    short = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
    head = " | ".join(short.get(d, d) for d in DTYPES)
    lines = [
        f"| op | {head} | pass | fail | known | skip |",
        "|---" * (len(DTYPES) + 5) + "|",
    ]
    for op in sorted(per_op):
        c = per_op[op]
        cells = " | ".join(_cell(COUNTS.get((op, d))) for d in DTYPES)
        lines.append(f"| {op} | {cells} | {c['pass']} | {c['fail']} | {c['known']} | {c['skip']} |")
    tot: collections.Counter[str] = collections.Counter()
    for c in per_op.values():
        tot.update(c)
    blanks = " |" * len(DTYPES)
    lines.append(
        f"| **total** ({len(per_op)} ops) |{blanks} {tot['pass']} | {tot['fail']} "
        f"| {tot['known']} | {tot['skip']} |"
    )
    lines.append("")
    lines.append("| dtype | pass | fail | known | skip |")
    lines.append("|---|---|---|---|---|")
    for d in DTYPES:
        c = per_dtype.get(d, collections.Counter())
        lines.append(f"| {d} | {c['pass']} | {c['fail']} | {c['known']} | {c['skip']} |")
    return "\n".join(lines)


def matrix_summary() -> str:
    """One line per prim: matching cells, cells both refuse, cells torch cannot express."""
    lines = []
    for prim in sorted(RESULTS):
        c = RESULTS[prim]
        lines.append(
            f"{prim}: {c['match']} match, {c['both refuse']} both refuse, "
            f"{c['mismatch']} mismatch, {c['not expressible']} not expressible in torch"
        )
    return "\n".join(lines)
