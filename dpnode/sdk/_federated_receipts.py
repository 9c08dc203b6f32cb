"""What a federated release returns: each site's part, the combined receipt, the refusal.

Each site's part keeps that site's own :class:`~sdk.Receipt` (its ledger row, charge and
noise); the combined receipt adds the standard deviation of the combined value's noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpnode.sdk._display import fields_table, records_table
from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._publish import Receipt

__all__ = [
    "FederatedError",
    "FederatedReceipt",
    "FederatedResult",
    "SiteRelease",
    "noise_sd",
    "refusal_message",
]


def noise_sd(receipt: Receipt) -> float:
    """The standard deviation of the noise a release added to each of its values.

    >>> noise_sd(Receipt(1, "gaussian", 1.0, 1e-6, 0.1, 1.0, 1.0, 2.0, 9.0))
    2.0
    >>> round(noise_sd(Receipt(1, "laplace", 1.0, None, 0.0, 1.0, 1.0, 2.0, 9.0)), 4)
    2.8284
    """
    scale = float(receipt.noise_scale)
    return math.sqrt(2.0) * scale if receipt.mechanism == "laplace" else scale


@dataclass(frozen=True)
class SiteRelease:
    """One site's part of a federated release: its value and receipt, or why it refused."""

    node: str
    dataset: str
    rows: int
    #: the noised part (a tensor, or a list for several outputs); None when refused
    value: Any = None
    receipt: Receipt | None = None
    error: DPNodeError | None = None

    @property
    def refused(self) -> bool:
        return self.error is not None

    @property
    def noise_sd(self) -> float | None:
        """The standard deviation of this part's noise on each value (None when refused)."""
        return None if self.receipt is None else noise_sd(self.receipt)

    def __str__(self) -> str:
        if self.error is not None:
            why = f"{type(self.error).__name__}: {self.error}"
            return f"{self.node} ({self.dataset!r}): refused, {why}"
        assert self.receipt is not None
        return (
            f"{self.node} ({self.dataset!r}): ledger row {self.receipt.ledger_id}, "
            f"epsilon {self.receipt.epsilon:g} charged, {self.receipt.mechanism} noise of "
            f"scale {self.receipt.noise_scale:.4g} (sd {self.noise_sd:.4g})"
        )


@dataclass(frozen=True)
class FederatedReceipt:
    """What a federated release cost at each site and how noisy the combined value is.

    ``noise_sd``: the standard deviation of the combined value's noise on each value
    (exact for sums and for a mean over public row counts; None for a ``combine=`` of
    yours, whose effect on the noise only you know). ``partial``: some sites refused
    and the value combines the others (``allow_partial=True``); ``refused`` names them.
    """

    sites: tuple[SiteRelease, ...]
    noise_sd: float | None
    combined: str
    partial: bool = False

    @property
    def released(self) -> tuple[SiteRelease, ...]:
        return tuple(s for s in self.sites if not s.refused)

    @property
    def refused(self) -> tuple[SiteRelease, ...]:
        return tuple(s for s in self.sites if s.refused)

    @property
    def epsilon(self) -> dict[tuple[str, str], float]:
        """Epsilon charged at each site that released, by (node, dataset): each site's
        guarantee is its own (its ledger, its policy), not a sum across sites."""
        return {
            (s.node, s.dataset): s.receipt.epsilon for s in self.released if s.receipt is not None
        }

    def __str__(self) -> str:
        sd = "" if self.noise_sd is None else f", combined noise sd {self.noise_sd:.4g}"
        head = f"{self.combined}{sd}"
        if self.partial:
            head += f"; PARTIAL: {len(self.refused)} of {len(self.sites)} sites left out"
        return "\n".join([head, *(f"  {s}" for s in self.sites)])

    def _repr_html_(self) -> str:
        summary = fields_table(
            "federated receipt",
            [("combined", self.combined), ("noise sd", self.noise_sd), ("partial", self.partial)],
        )
        columns = ["node", "dataset", "rows", "ledger row", "epsilon", "mechanism", "noise sd"]
        rows = [
            (s.node, s.dataset, s.rows, "refused: " + str(s.error), "", "", "")
            if s.receipt is None
            else (
                s.node,
                s.dataset,
                s.rows,
                s.receipt.ledger_id,
                s.receipt.epsilon,
                s.receipt.mechanism,
                s.noise_sd,
            )
            for s in self.sites
        ]
        return summary + records_table("sites", columns, rows)


@dataclass(frozen=True)
class FederatedResult:
    """The combined value and its :class:`FederatedReceipt`."""

    value: Any
    receipt: FederatedReceipt

    @property
    def sites(self) -> tuple[SiteRelease, ...]:
        return self.receipt.sites

    @property
    def refused(self) -> tuple[SiteRelease, ...]:
        return self.receipt.refused


class FederatedError(DPNodeError):
    """Some sites refused a federated release; nothing was combined.

    ``sites``: every site's :class:`SiteRelease`; ``released`` the parts that were
    released (and charged at their site), ``refused`` the others with their errors.
    """

    code = "federated_refused"

    def __init__(self, detail: str, sites: Sequence[SiteRelease]) -> None:
        super().__init__(detail)
        self.sites = tuple(sites)

    @property
    def released(self) -> tuple[SiteRelease, ...]:
        return tuple(s for s in self.sites if not s.refused)

    @property
    def refused(self) -> tuple[SiteRelease, ...]:
        return tuple(s for s in self.sites if s.refused)


def refusal_message(parts: Sequence[SiteRelease], allow_partial: bool) -> str:
    refused = [p for p in parts if p.refused]
    released = [p for p in parts if not p.refused]
    lines = [
        f"{len(refused)} of {len(parts)} sites refused the federated release, so nothing was "
        "combined:"
    ]
    lines += [f"  {p}" for p in refused]
    if released:
        lines.append(
            "These sites released their part (charged at their node; in this error's sites):"
        )
        lines += [f"  {p}" for p in released]
    if not allow_partial and released:
        lines.append("Pass allow_partial=True to combine the released parts without the others.")
    return "\n".join(lines)
