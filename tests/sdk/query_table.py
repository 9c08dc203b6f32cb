"""A small table for the query builder's tests: its columns, bounds and categories."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpnode import sdk

N = 600
EDUCATION = ["primary", "secondary", "tertiary"]
BOUNDS = {"sex": (0, 1), "age": (0, 120), "income": (0, 200), "hours": (0, 80)}


def table(seed: int, n: int = N) -> dict[str, np.ndarray]:
    """Rows of people: education is half primary, 30% secondary, 20% tertiary."""
    rng = np.random.default_rng(seed)
    edu = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    return {
        "sex": rng.integers(0, 2, n),
        "education": np.array(EDUCATION, dtype=object)[edu],
        "age": rng.integers(18, 91, n),
        "income": np.clip(rng.normal(40 + 30 * edu, 15, n), 0, 200),
        "hours": rng.integers(10, 61, n),
        "smoker": rng.random(n) < 0.3,
    }


def upload(owner: sdk.Client, scientist: sdk.Client, name: str = "people") -> sdk.DatasetHandle:
    """Upload :func:`table` (seed 0) with a mock (seed 1); the scientist's handle on it."""
    owner.upload_dataset(
        name,
        table(0),
        bounds=BOUNDS,
        categories={"education": EDUCATION},
        mock=table(1, 100),
    )
    return scientist.dataset(name)


def codes(data: dict[str, np.ndarray]) -> np.ndarray:
    """The education column as category codes."""
    return np.array([EDUCATION.index(e) for e in data["education"]])


def unbounded(ds: sdk.DatasetHandle, column: str) -> sdk.DatasetHandle:
    """The handle as a node would list ``column`` if its bounds were not finite (the node
    refuses such bounds at upload: only a handle can say so)."""
    info = dataclasses.replace(ds.columns[column], bounds=(-math.inf, math.inf))
    return dataclasses.replace(ds, columns={**ds.columns, column: info})
