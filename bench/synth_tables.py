"""The synthetic-data bench's tables, binned into codes as the node bins them.

Four tables: the demo's two tabular datasets (diabetes, breast cancer; ``dpnode.node.demo``)
with their declared bounds, and two the bench generates with a fixed seed: eight categorical
columns in a chain of dependencies, and a mixed numeric/categorical table of 20,000+ rows.
Each is binned by ``dpnode.core.synth.domain`` (public metadata only, the node's own
binning), and names one target column for the train-on-synthetic/test-on-real accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpnode.core.synth import ColumnFacts, domain_of, encode
from dpnode.core.synth.domain import Attribute

Codes = npt.NDArray[np.int64]
Columns = tuple[list[ColumnFacts], list[npt.NDArray[np.generic]]]

#: The share of rows held out from every synthesizer to test the classifiers on.
TEST_SHARE = 0.25


@dataclass(frozen=True)
class Table:
    """A binned table: ``train`` is what the synthesizers see, ``test`` is held out.

    Attributes:
        name: the table's name in the printed report.
        attributes: the domain (one finite attribute per column).
        train, test: rows x columns of codes.
        target: the column the classifier predicts (its codes are the classes).
    """

    name: str
    attributes: tuple[Attribute, ...]
    train: Codes
    test: Codes
    target: int

    @property
    def sizes(self) -> list[int]:
        return [a.size for a in self.attributes]


def diabetes() -> Columns:
    """The demo's diabetes table, its target made a class: progression above 140 (about the
    median) or not, one public threshold."""
    from sklearn.datasets import load_diabetes

    from dpnode.node.demo import _DIABETES_BOUNDS

    data = load_diabetes(scaled=False)
    names = list(data.feature_names)
    values: list[npt.NDArray[np.generic]] = [data.data[:, i] for i in range(len(names))]
    facts = [ColumnFacts(n, "float64", (), *map(float, _DIABETES_BOUNDS[n])) for n in names]
    facts.append(ColumnFacts("progressed", "int64", (), 0.0, 1.0, ("no", "yes")))
    values.append((data.target > 140).astype(np.int64))
    return facts, values


def breast_cancer() -> Columns:
    """The demo's breast cancer table: 30 features over their declared bounds, the label."""
    from sklearn.datasets import load_breast_cancer

    from dpnode.node.demo import _CANCER_MAXIMA, nice_ceiling

    data = load_breast_cancer()
    facts = [
        ColumnFacts(n.replace(" ", "_"), "float64", (), 0.0, nice_ceiling(_CANCER_MAXIMA[n]))
        for n in data.feature_names
    ]
    values: list[npt.NDArray[np.generic]] = [data.data[:, i] for i in range(len(facts))]
    facts.append(ColumnFacts("label", "int64", (), 0.0, 1.0, tuple(data.target_names)))
    values.append(data.target.astype(np.int64))
    return facts, values


def categorical(rows: int = 5000) -> Columns:
    """Eight categorical columns in a chain of dependencies (each a noisy copy of the last)."""
    rng = np.random.default_rng(0)
    sizes = [3, 4, 2, 5, 3, 6, 2, 4]
    values: list[npt.NDArray[np.generic]] = []
    previous = rng.integers(0, sizes[0], rows)
    for j, size in enumerate(sizes):
        keep = rng.random(rows) < 0.7
        column = np.where(keep, previous % size, rng.integers(0, size, rows)) if j else previous
        values.append(column)
        previous = column
    facts = [
        ColumnFacts(f"c{j}", "int64", (), 0.0, s - 1.0, tuple(map(str, range(s))))
        for j, s in enumerate(sizes)
    ]
    return facts, values


def mixed(rows: int = 24_000) -> Columns:
    """A census-like table: four numeric and five categorical columns, the numeric ones
    driven by the categorical ones, and a class (high income) that depends on several."""
    rng = np.random.default_rng(1)
    education = rng.choice(5, rows, p=[0.1, 0.3, 0.3, 0.2, 0.1])
    sex = rng.integers(0, 2, rows)
    region = rng.choice(4, rows, p=[0.4, 0.3, 0.2, 0.1])
    occupation = np.where(rng.random(rows) < 0.6, education + rng.integers(0, 4, rows), 0)
    occupation = np.clip(occupation + rng.integers(0, 2, rows), 0, 7)
    age = np.clip(rng.normal(38 + 3 * education, 11, rows), 18, 90).astype(np.int64)
    hours = np.clip(rng.normal(36 + 4 * sex + 1.5 * education, 8, rows), 1, 99)
    income = np.exp(rng.normal(9.6 + 0.25 * education + 0.01 * (age - 18), 0.5, rows))
    income = np.clip(income * hours / 40, 0, 250_000)
    debt = np.clip(income * rng.uniform(0, 0.6, rows) + rng.normal(0, 2000, rows), 0, 100_000)
    high = (income > np.quantile(income, 0.7)).astype(np.int64)
    facts = [
        ColumnFacts("age", "int64", (), 18.0, 90.0),
        ColumnFacts("hours", "float64", (), 1.0, 99.0),
        ColumnFacts("income", "float64", (), 0.0, 250_000.0),
        ColumnFacts("debt", "float64", (), 0.0, 100_000.0),
        ColumnFacts("education", "int64", (), 0.0, 4.0, tuple("ABCDE")),
        ColumnFacts("sex", "int64", (), 0.0, 1.0, ("f", "m")),
        ColumnFacts("region", "int64", (), 0.0, 3.0, ("n", "e", "s", "w")),
        ColumnFacts("occupation", "int64", (), 0.0, 7.0, tuple("abcdefgh")),
        ColumnFacts("high_income", "int64", (), 0.0, 1.0, ("no", "yes")),
    ]
    return facts, [age, hours, income, debt, education, sex, region, occupation, high]


def binned(name: str, columns: Columns, target: str) -> Table:
    """``columns`` binned over their public metadata, a fixed quarter of the rows held out.

    The domain is chosen from the training rows' count (public), as the node would for the
    table it is given.
    """
    facts, values = columns
    rows = len(values[0])
    order = np.random.default_rng(2).permutation(rows)
    cut = rows - int(rows * TEST_SHARE)
    attrs = domain_of(facts, cut)
    codes = np.stack([encode(a, v) for a, v in zip(attrs, values, strict=True)], axis=1)
    index = [f.name for f in facts].index(target)
    return Table(name, attrs, codes[order[:cut]], codes[order[cut:]], index)


#: The bench's tables: name -> how to make it (mixed's rows from --rows).
TABLES: dict[str, Callable[[int], Table]] = {
    "diabetes": lambda rows: binned("diabetes", diabetes(), "progressed"),
    "breast_cancer": lambda rows: binned("breast_cancer", breast_cancer(), "label"),
    "categorical8": lambda rows: binned("categorical8", categorical(), "c7"),
    "mixed": lambda rows: binned("mixed", mixed(rows), "high_income"),
}
