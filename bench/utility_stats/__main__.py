"""``python -m bench.utility_stats``: see the package's docstring."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.utility import PASSWORD, in_process_node
from bench.utility_stats import __doc__ as about
from bench.utility_stats.report import HEADER, Side, line
from bench.utility_stats.rows import KEYS_DELTA, REGRESSION_DELTA, ROWS, Row
from bench.utility_stats.tables import TABLES
from dpnode.sdk import DPNodeError


def _why(error: Exception) -> str:
    """A refusal's message in one table cell: its first line, cut to 160 characters."""
    first = (str(error).strip().splitlines() or [""])[0]
    first = first if len(first) <= 160 else first[:157] + "..."
    if isinstance(error, DPNodeError):
        return f"refused: {first}"
    return f"failed: {type(error).__name__}: {first}"


def _timed(release: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = release()
    return value, time.perf_counter() - start


def measure(row: Row, ds: Any, repeat: int, epsilon: float) -> tuple[Side, Side]:
    """``repeat`` releases of the row by each side, interleaved (both meet the same load).
    A side whose release is refused (or fails) is not asked again; the other goes on."""
    table = TABLES[row.table]()
    stat = row.statistic
    truth = stat.truth(table)
    sides = {"ours": Side(), "theirs": Side()}
    releases: dict[str, Callable[[], Any] | None] = {}
    for name, make in (
        ("ours", lambda: stat.ours(ds, table, epsilon)),
        ("theirs", lambda: stat.theirs(table, epsilon)),
    ):
        try:
            releases[name] = make()
        except Exception as error:  # a side that cannot even build the query
            sides[name].refused, releases[name] = _why(error), None
    for _ in range(repeat):
        for name, side in sides.items():
            release = releases[name]
            if release is None:
                continue
            try:
                value, seconds = _timed(release)
                side.errors.append(stat.error(table, value, truth))
                side.seconds.append(seconds)
            except Exception as error:  # the bench prints a refusal and goes on
                side.refused, releases[name] = _why(error), None
    return sides["ours"], sides["theirs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(about or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument(
        "--rows",
        nargs="*",
        default=None,
        help='only the rows whose "table: statistic" contains one of these',
    )
    args = parser.parse_args()
    rows = [r for r in ROWS if args.rows is None or any(p in r.label for p in args.rows)]
    if not rows:
        parser.error(f"no row matches {args.rows}")
    names = list(dict.fromkeys(r.table for r in rows))
    started = time.perf_counter()
    print(
        f"epsilon {args.epsilon:g} (dpnode's regression: delta {REGRESSION_DELTA:g}; keys "
        f"above a threshold, both sides: delta {KEYS_DELTA:g}), "
        f"{args.repeat} releases a row; mean absolute error, median time of a release\n"
    )
    for name in names:
        t = TABLES[name]()
        print(f"* {name}: {t.rows} rows, {len(t.columns)} columns ({t.about})")
    print("\n" + HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp, in_process_node(Path(tmp)) as login:
        admin, owner = login("admin@x.org"), login("owner@x.org")
        for name in names:
            t = TABLES[name]()
            owner.upload_dataset(name, t.upload(), bounds=t.bounds, categories=t.categories)
        budget = 2 * args.epsilon * args.repeat
        admin.set_policy(
            f"[roles.data_scientist]\nepsilon = {budget!r}\ndelta = 0.5\n", reason="bench"
        )
        for number, row in enumerate(rows):
            # An analyst a row: each row's releases (and their deltas) fit one budget, however
            # many rows the run has.
            admin.create_user(f"analyst{number}@x.org", PASSWORD)
            handle = login(f"analyst{number}@x.org").dataset(row.table)
            ours, theirs = measure(row, handle, args.repeat, args.epsilon)
            print(line(row.table, row.statistic.name, ours, theirs), flush=True)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
