"""Demo content for ``dpnode serve --demo``: three accounts and real public datasets.

The datasets ship with scikit-learn (no download). Their bounds are declared up
front as round numbers above the ranges published with each dataset — the way an
owner should declare bounds: from domain knowledge, never from the private data.
Each dataset also gets mock data drawn uniformly inside its bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import select

from dpnode.node.context import NodeContext
from dpnode.node.db.models import Dataset, User
from dpnode.node.services import datasets, users
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.tabular import ColumnSpec


@dataclass(frozen=True)
class DemoAccount:
    email: str
    password: str
    role: str


ACCOUNTS = (
    DemoAccount("admin@example.org", "admin-demo-password", "admin"),
    DemoAccount("owner@example.org", "owner-demo-password", "data_owner"),
    DemoAccount("ds@example.org", "ds-demo-password", "data_scientist"),
)

_DIABETES_BOUNDS = {
    "age": (0, 120),
    "sex": (1, 2),
    "bmi": (10, 70),
    "bp": (40, 200),
    "s1": (50, 400),
    "s2": (0, 300),
    "s3": (0, 150),
    "s4": (0, 15),
    "s5": (2, 8),
    "s6": (40, 200),
    "target": (0, 400),
}

#: Published maxima of the Wisconsin breast cancer features (UCI documentation).
_CANCER_MAXIMA = {
    "mean radius": 28.11,
    "mean texture": 39.28,
    "mean perimeter": 188.5,
    "mean area": 2501.0,
    "mean smoothness": 0.1634,
    "mean compactness": 0.3454,
    "mean concavity": 0.4268,
    "mean concave points": 0.2012,
    "mean symmetry": 0.304,
    "mean fractal dimension": 0.09744,
    "radius error": 2.873,
    "texture error": 4.885,
    "perimeter error": 21.98,
    "area error": 542.2,
    "smoothness error": 0.03113,
    "compactness error": 0.1354,
    "concavity error": 0.396,
    "concave points error": 0.05279,
    "symmetry error": 0.07895,
    "fractal dimension error": 0.02984,
    "worst radius": 36.04,
    "worst texture": 49.54,
    "worst perimeter": 251.2,
    "worst area": 4254.0,
    "worst smoothness": 0.2226,
    "worst compactness": 1.058,
    "worst concavity": 1.252,
    "worst concave points": 0.291,
    "worst symmetry": 0.6638,
    "worst fractal dimension": 0.2075,
}


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``x``.

    >>> nice_ceiling(28.11), nice_ceiling(0.1634), nice_ceiling(2501.0)
    (50.0, 0.2, 5000.0)
    """
    exponent = math.floor(math.log10(x))
    for step in (1, 2, 5, 10):
        candidate = float(step * 10.0**exponent)
        if candidate >= x:
            return round(candidate, 12)
    raise AssertionError("unreachable")


def _mock(
    columns: Mapping[str, npt.NDArray[Any]], spec: ColumnSpec, rows: int, seed: int
) -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    out: dict[str, npt.NDArray[Any]] = {}
    for name, real in columns.items():
        shape = (rows, *real.shape[1:])
        if name in spec.categories:
            out[name] = rng.integers(0, len(spec.categories[name]), shape).astype(real.dtype)
            continue
        low, high = spec.bounds[name]
        if real.dtype.kind in "iu":
            out[name] = rng.integers(int(low), int(high) + 1, shape).astype(real.dtype)
        else:
            out[name] = rng.uniform(low, high, shape).astype(real.dtype)
    return out


def _upload(
    name: str, description: str, tags: list[str], columns: dict[str, Any], spec: ColumnSpec
) -> DatasetUpload:
    return DatasetUpload(
        name=name,
        description=description,
        tags=tags,
        spec=spec,
        order=list(columns),
        columns=columns,
        mock_order=list(columns),
        mock=_mock(columns, spec, 200, seed=len(name)),
    )


def demo_datasets() -> list[DatasetUpload]:
    """Diabetes, breast cancer and digits, from scikit-learn."""
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits

    diabetes = load_diabetes(scaled=False)
    columns = {n: diabetes.data[:, i].copy() for i, n in enumerate(diabetes.feature_names)}
    columns["target"] = diabetes.target.astype(np.float64)
    out = [
        _upload(
            "diabetes",
            "Diabetes progression one year after baseline, 442 patients (Efron et al. 2004): "
            "age, sex, BMI, blood pressure, six blood serum measurements, target.",
            ["health", "tabular", "regression"],
            columns,
            ColumnSpec(bounds=_DIABETES_BOUNDS, categories={}),
        )
    ]
    cancer = load_breast_cancer()
    names = [n.replace(" ", "_") for n in cancer.feature_names]
    columns = {n: cancer.data[:, i].copy() for i, n in enumerate(names)}
    columns["label"] = cancer.target.astype(np.int64)
    bounds = {n.replace(" ", "_"): (0.0, nice_ceiling(m)) for n, m in _CANCER_MAXIMA.items()}
    out.append(
        _upload(
            "breast_cancer",
            "Breast cancer Wisconsin (diagnostic): 30 features of cell nuclei from 569 "
            "biopsies; label 0 = malignant, 1 = benign.",
            ["health", "tabular", "classification"],
            columns,
            ColumnSpec(bounds=bounds, categories={"label": list(cancer.target_names)}),
        )
    )
    digits = load_digits()
    out.append(
        _upload(
            "digits",
            "8x8 images of handwritten digits (1797), grey levels 0-16, with their labels.",
            ["images", "classification"],
            {"image": digits.images.astype(np.float32), "label": digits.target.astype(np.int64)},
            ColumnSpec(
                bounds={"image": (0, 16)}, categories={"label": [str(d) for d in range(10)]}
            ),
        )
    )
    return out


def seed(context: NodeContext) -> list[DemoAccount]:
    """Create the demo accounts and datasets that do not exist yet (idempotent)."""
    with context.sessions() as session:
        for account in ACCOUNTS:
            if session.scalar(select(User.id).where(User.email == account.email)) is None:
                users.create_user(
                    session,
                    context.hasher,
                    None,
                    email=account.email,
                    password=account.password,
                    role=account.role,
                )
        owner = session.scalar(select(User).where(User.email == ACCOUNTS[1].email))
        assert owner is not None
        for upload in demo_datasets():
            if session.scalar(select(Dataset.id).where(Dataset.name == upload.name)) is None:
                datasets.create_dataset(
                    session,
                    context.store,
                    owner,
                    upload,
                    max_elements=context.settings.max_upload_elements,
                )
    return list(ACCOUNTS)


def banner(url: str) -> str:
    """What ``dpnode serve --demo`` prints: credentials and a snippet to paste into Python."""
    lines = [f"dpnode demo node on {url}", f"Console: {url}/console/", ""]
    lines += ["Demo accounts (development only):"]
    lines += [f"  {a.role:<15} {a.email:<20} {a.password}" for a in ACCOUNTS]
    ds = ACCOUNTS[2]
    lines += [
        "",
        "Paste into Python (after `make sdk`: .venv/bin/python; or pip install 'dpnode[sdk]'):",
        "",
        "  from dpnode import sdk",
        f'  client = sdk.login("{url}", email="{ds.email}", password="{ds.password}")',
        '  ds = sdk.search(tags=["health"], text="diabetes")[0]',
        "  print(ds)",
        "",
        "Start afresh: stop the node, then `make demo-reset` (deletes ./dpnode-data).",
        "",
    ]
    return "\n".join(lines)
