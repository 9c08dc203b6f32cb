"""``dpnode dataset synthesize-mock``: a dataset's mock made a differentially private synthetic
table on the command line, paid from the dataset's cap.

It goes through the service the API route calls (``dpnode.node.services.mock_synthesis``), with
the dataset's owner as the actor (a ledger row names a user; the owner's own budget is not
charged), and waits for the job in this process.
"""

from __future__ import annotations

import argparse
from typing import Any

from dpnode.core.errors import EvaluationError
from dpnode.node.cli_common import migrated_context, number, whole
from dpnode.node.db.models import Dataset, SynthesisJob
from dpnode.node.services import datasets, mock_synthesis, synthesis
from dpnode.node.services.synthesis_methods import METHODS

__all__ = ["add_dataset_actions"]


def cmd_dataset_synthesize_mock(args: argparse.Namespace) -> None:
    context = migrated_context()
    try:
        with context.sessions() as session:
            dataset = datasets.get_dataset(session, args.name)
            ident, owner_id, owner = dataset.id, dataset.owner_id, dataset.owner.email
        request = synthesis.SynthesisRequest(
            epsilon=args.epsilon, delta=args.delta, rows=args.rows, method=args.method
        )

        def answer(_: Dataset, receipt: dict[str, Any]) -> dict[str, Any]:
            return {"receipt": receipt}

        started = mock_synthesis.synthesize_mock(context, owner_id, ident, request, answer)
        assert isinstance(started, synthesis.Started)  # no key: nothing to replay
        context.synthesis_jobs.join()
        with context.sessions() as session:
            job = session.get_one(SynthesisJob, started.job)
            if job.state != "answered":
                raise EvaluationError(job.error or f"synthesis job {job.id} did not finish")
            receipt = (job.result or {})["receipt"]
            dataset = datasets.get_dataset(session, ident)
        print(
            f"the mock of dataset {dataset.name!r} is now synthetic ({args.method}, epsilon "
            f"{args.epsilon:g}, delta {args.delta:g}, {dataset.mock_row_count} rows), charged "
            f"to its cap as ledger row {receipt['ledger_id']} in {owner}'s name; cap: epsilon "
            f"{receipt['cap_epsilon_used']:.6g} used of {receipt['cap_epsilon']:g}"
        )
    finally:
        context.close()


def add_dataset_actions(dataset: Any) -> None:
    """``dpnode dataset synthesize-mock``."""
    mock = dataset.add_parser(
        "synthesize-mock",
        help="make a dataset's mock a differentially private synthetic table, paid from its cap",
    )
    mock.add_argument("name", metavar="NAME")
    mock.add_argument("--epsilon", type=number, required=True, help="taken from the cap")
    mock.add_argument("--delta", type=number, required=True, help="> 0")
    mock.add_argument("--method", choices=sorted(METHODS), default="mst")
    mock.add_argument("--rows", type=whole, default=None, help="mock rows (default: the data's)")
    mock.set_defaults(func=cmd_dataset_synthesize_mock)
