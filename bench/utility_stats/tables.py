"""The bench's three tables: the diabetes demo data and two generated ones of other shapes.

* ``diabetes``: scikit-learn's (unscaled: 442 patients), as the demo node ships it, with the
  two integer keys the group-by rows use.
* ``census``: 20,000 people, generated: integer age [17, 90] and hours [1, 99], income
  [0, 200,000], education (8 categories), sex (2) and occupation (15, skewed as in the US
  census "adult" extract, where the three commonest are within 2% of each other).
  Income grows with education, hours and age (to 57) and is lognormal.
* ``chemistry``: 178 wine-like samples of 3 cultivars (59, 71, 48), five float measurements
  whose means depend on the cultivar and which are correlated within it (alcohol with
  proline, flavanoids against malic acid).

Both generated tables come from fixed seeds; every value lies inside the table's declared
bounds (drawn values are clipped into them), which are round numbers from domain knowledge.
Categorical columns are held as integer codes; the upload sends their names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Table:
    """A table's columns (categorical ones as integer codes into ``categories``), the public
    bounds of every other column, and a line describing it."""

    name: str
    columns: dict[str, np.ndarray]
    bounds: dict[str, tuple[float, float]]
    categories: dict[str, list[str]] = field(default_factory=dict)
    about: str = ""
    #: integer columns that are group keys only (a zip code), not numbers to summarise
    key_columns: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def keys(self, column: str) -> list[Any]:
        """A group key's public values: a categorical column's names, an integer column's
        integers within its bounds.

        >>> diabetes().keys("sex")
        [0, 1]
        """
        if column in self.categories:
            return list(self.categories[column])
        lo, hi = self.bounds[column]
        return list(range(int(lo), int(hi) + 1))

    def codes(self, column: str) -> np.ndarray:
        """A group key's values as indices into :meth:`keys`."""
        if column in self.categories:
            return self.columns[column]
        return (self.columns[column] - int(self.bounds[column][0])).astype(np.int64)

    def upload(self) -> dict[str, np.ndarray]:
        """The columns as the node takes them: categorical ones by name."""
        return {
            name: np.array(self.categories[name])[values] if name in self.categories else values
            for name, values in self.columns.items()
        }

    def numeric(self) -> list[str]:
        """The columns that are not categorical, in order (what ``describe`` summarises)."""
        return [c for c in self.columns if c not in self.categories and c not in self.key_columns]


@cache
def diabetes() -> Table:
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    age = d.data[:, 0].astype(np.float64)
    columns = {
        "age": age,
        "bmi": d.data[:, 2].astype(np.float64),
        "sex": d.data[:, 1].astype(np.int64) - 1,  # 1 and 2 in the data: groups 0 and 1
        "age_group": np.clip((age - 19) // 6, 0, 9).astype(np.int64),  # 10 groups
        "target": d.target.astype(np.float64),
    }
    bounds = {
        "age": (0.0, 120.0),
        "bmi": (10.0, 70.0),
        "sex": (0, 1),
        "age_group": (0, 9),
        "target": (0.0, 400.0),
    }
    return Table("diabetes", columns, bounds, about="scikit-learn's, unscaled")


EDUCATION = [
    "elementary",
    "some-high-school",
    "high-school",
    "some-college",
    "associate",
    "bachelors",
    "masters",
    "doctorate",
]
#: shares of the education levels, and each level's effect on log income
EDUCATION_SHARES = [0.05, 0.08, 0.32, 0.22, 0.08, 0.17, 0.06, 0.02]
EDUCATION_EFFECT = [-0.35, -0.25, 0.0, 0.1, 0.15, 0.45, 0.6, 0.75]
OCCUPATIONS = [
    "professional",
    "craft-repair",
    "managerial",
    "clerical",
    "sales",
    "other-service",
    "machine-operator",
    "transport",
    "handler-cleaner",
    "farming-fishing",
    "tech-support",
    "protective-service",
    "private-household",
    "armed-forces",
    "unemployed",
]
#: counts per 30,000 in the "adult" extract (the last, unlisted there, made small)
OCCUPATION_WEIGHTS = [4140, 4099, 4066, 3770, 3650, 3295, 2002, 1597, 1370, 994, 928, 649, 149]
OCCUPATION_WEIGHTS += [9, 60]
CENSUS_SEED = 20_250


@cache
def census(rows: int = 20_000) -> Table:
    rng = np.random.default_rng(CENSUS_SEED)
    age = np.clip(np.rint(17 + rng.gamma(3.0, 7.5, rows)), 17, 90).astype(np.int64)
    sex = (rng.random(rows) < 0.6).astype(np.int64)  # 1: male
    education = rng.choice(len(EDUCATION), rows, p=EDUCATION_SHARES).astype(np.int64)
    weights = np.array(OCCUPATION_WEIGHTS, dtype=float)
    occupation = rng.choice(len(OCCUPATIONS), rows, p=weights / weights.sum()).astype(np.int64)
    usual = rng.random(rows) < 0.45  # the 40-hour week
    drawn = 40 + 12 * rng.standard_normal(rows) - 4 * (1 - sex) - 0.15 * np.abs(age - 45)
    hours = np.clip(np.where(usual, 40, np.rint(drawn)), 1, 99).astype(np.int64)
    log_income = (
        10.0
        + np.array(EDUCATION_EFFECT)[education]
        + 0.012 * (hours - 40)
        + 0.04 * (age - 17)
        - 0.0005 * (age - 17) ** 2
        + 0.15 * sex
        + 0.6 * rng.standard_normal(rows)
    )
    income = np.clip(np.exp(log_income), 0.0, 200_000.0)
    return Table(
        "census",
        {
            "age": age,
            "hours": hours,
            "income": income,
            "education": education,
            "sex": sex,
            "occupation": occupation,
            "zip": zips(rows),
        },
        {"age": (17, 90), "hours": (1, 99), "income": (0.0, 200_000.0), "zip": ZIP_BOUNDS},
        {"education": EDUCATION, "sex": ["female", "male"], "occupation": OCCUPATIONS},
        about=f"generated, seed {CENSUS_SEED}; zip codes, seed {ZIP_SEED}",
        key_columns=("zip",),
    )


#: a zip-like key: 5 digits, too many to enumerate as public keys
ZIP_BOUNDS = (0, 99_999)
ZIP_SEED = 94_110
#: zip codes in use, and the exponent of their Zipf-like popularity
ZIPS, ZIP_EXPONENT = 1500, 1.1


def zips(rows: int) -> np.ndarray:
    """A zip code per row, from its own stream (the other columns do not change): 1,500
    codes in use, the r-th most common with weight ``r^-1.1`` (a few hundred rows for the
    first, one or none for the last).

    >>> z = zips(20_000)
    >>> int(z.min()) >= 0 and int(z.max()) <= 99_999 and len(set(z.tolist())) > 500
    True
    """
    rng = np.random.default_rng(ZIP_SEED)
    codes = rng.choice(ZIP_BOUNDS[1] + 1, ZIPS, replace=False)
    weights = 1.0 / np.arange(1, ZIPS + 1) ** ZIP_EXPONENT
    return rng.choice(codes, rows, p=weights / weights.sum()).astype(np.int64)


CULTIVARS = ["cultivar-1", "cultivar-2", "cultivar-3"]
CULTIVAR_SIZES = [59, 71, 48]
CHEMISTRY_BOUNDS = {
    "alcohol": (10.0, 15.0),
    "malic_acid": (0.0, 6.0),
    "flavanoids": (0.0, 6.0),
    "color_intensity": (0.0, 14.0),
    "proline": (200.0, 1800.0),
}
#: per cultivar, each column's mean and standard deviation (close to the UCI wine data's)
CHEMISTRY_MEANS = [
    [13.74, 2.01, 2.98, 5.53, 1116.0],
    [12.28, 1.93, 2.08, 3.09, 520.0],
    [13.15, 3.33, 0.78, 7.40, 630.0],
]
CHEMISTRY_SDS = [0.46, 1.0, 0.55, 1.3, 260.0]
#: within a cultivar: alcohol-proline 0.5, malic acid-flavanoids -0.3, alcohol-colour 0.4
CHEMISTRY_CORRELATION = np.array(
    [
        [1.0, 0.1, 0.15, 0.4, 0.5],
        [0.1, 1.0, -0.3, 0.2, 0.0],
        [0.15, -0.3, 1.0, -0.1, 0.2],
        [0.4, 0.2, -0.1, 1.0, 0.2],
        [0.5, 0.0, 0.2, 0.2, 1.0],
    ]
)
CHEMISTRY_SEED = 178


@cache
def chemistry() -> Table:
    rng = np.random.default_rng(CHEMISTRY_SEED)
    cultivar = np.repeat(np.arange(3), CULTIVAR_SIZES).astype(np.int64)
    sds = np.array(CHEMISTRY_SDS)
    covariance = CHEMISTRY_CORRELATION * np.outer(sds, sds)
    draws = np.array(CHEMISTRY_MEANS)[cultivar] + rng.multivariate_normal(
        np.zeros(len(sds)), covariance, len(cultivar)
    )
    columns: dict[str, np.ndarray] = {}
    for i, (name, (lo, hi)) in enumerate(CHEMISTRY_BOUNDS.items()):
        columns[name] = np.clip(draws[:, i], lo, hi)
    columns["cultivar"] = cultivar
    return Table(
        "chemistry",
        columns,
        dict(CHEMISTRY_BOUNDS),
        {"cultivar": CULTIVARS},
        about=f"generated, seed {CHEMISTRY_SEED}",
    )


TABLES = {"diabetes": diabetes, "census": census, "chemistry": chemistry}
