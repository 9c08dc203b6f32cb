"""What the budget mark adds to a publish: small publishes with and without it, in one run.

    python -m bench.budget_mark [--publishes 200] [--rounds 4]

A node in process on a SQLite file (each charge one durable commit), a 1,000-row dataset, and
``--publishes`` publishes of a mean at epsilon 0.01 per round; rounds alternate between the
node as it runs (the mark covers each charge before it commits, writing the file when a
reservation runs out: with the default 0.5 that is once per 51 publishes here) and the same
node with the mark left out of the charge. Prints the median publish time of each and their
ratio. The dev box is shared: compare medians, not single runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.services import users
from dpnode.node.settings import Settings

PASSWORD = "a long benchmark password"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data"
        settings = Settings(
            data_dir=data,
            argon2_memory_kib=8192,
            argon2_time_cost=1,
            default_epsilon_budget=700,
        )
        data.mkdir()
        upgrade(settings.resolved_database_url)
        context = NodeContext.from_settings(settings)
        mark = context.mark
        with context.sessions() as session:
            for email, role in (
                ("o@example.org", "data_owner"),
                ("d@example.org", "data_scientist"),
            ):
                users.create_user(
                    session, context.hasher, None, email=email, password=PASSWORD, role=role
                )
        with TestClient(create_app(context=context)) as http:
            url, transport = "http://testserver", http._transport
            owner = sdk.login(url, email="o@example.org", password=PASSWORD, transport=transport)
            x = np.random.default_rng(0).uniform(0, 1, 1000)
            owner.upload_dataset("b", {"x": x}, tags=["b"], bounds={"x": (0, 1)})
            client = sdk.login(url, email="d@example.org", password=PASSWORD, transport=transport)
            column = client.dataset("b")["x"]
            for _ in range(args.publishes // 4):  # warm-up, not timed
                column.mean().publish(epsilon=0.01)
            times: dict[str, list[float]] = {"with the mark": [], "without": []}
            for round_ in range(args.rounds):
                name = "with the mark" if round_ % 2 == 0 else "without"
                context.mark = mark if name == "with the mark" else None  # type: ignore[assignment]
                for _ in range(args.publishes):
                    start = time.perf_counter()
                    column.mean().publish(epsilon=0.01)
                    times[name].append(time.perf_counter() - start)
            context.mark = mark
        context.close()
    with_mark, without = (statistics.median(times[k]) * 1e3 for k in times)
    print(f"publishes per case: {len(times['without'])} ({args.rounds} rounds, interleaved)")
    print(f"median publish, with the mark:    {with_mark:.3f} ms")
    print(f"median publish, without the mark: {without:.3f} ms")
    print(f"ratio: {with_mark / without:.3f}")


if __name__ == "__main__":
    main()
