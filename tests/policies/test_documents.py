"""Policy documents: the shipped default, refusals that name the key, and the canonical form."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from dpnode import policies
from dpnode.policies import Policy, PolicyError, default_policy, load_policy, load_policy_file

DEFAULT_TOML = Path(policies.__file__).with_name("default.toml")


def _uncommented() -> str:
    # Prose comments start with "# "; commented-out examples with "#" then the key or "[".
    return re.sub(r"(?m)^#(?=[\[a-z\"])", "", DEFAULT_TOML.read_text(encoding="utf-8"))


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every key a document may have, with ``*`` for a user's email or a dataset's name."""
    out = set()
    for name, info in model.model_fields.items():
        out.add(prefix + name)
        annotation = info.annotation
        if get_origin(annotation) is dict:
            out.add(f"{prefix}{name}.*")
            out |= _fields(get_args(annotation)[1], f"{prefix}{name}.*.")
            continue
        for arg in (annotation, *get_args(annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out |= _fields(arg, f"{prefix}{name}.")
    return out


def _keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key present in a canonical document, in the notation of :func:`_fields`."""
    out = set()
    for key, value in data.items():
        path = prefix + ("*" if prefix in ("users.", "datasets.") else key)
        out.add(path)
        if isinstance(value, dict):
            out |= _keys(value, path + ".")
    return out


def test_shipped_default_is_valid_and_adds_no_rule() -> None:
    policy = default_policy()
    assert policy == load_policy_file(DEFAULT_TOML)
    assert policy.name == "default"
    neutral = Policy(name=policy.name, description=policy.description)
    assert policy.to_dict() == neutral.to_dict()


def test_every_option_is_documented_by_a_valid_example_in_default_toml() -> None:
    full = load_policy(_uncommented())
    documented = _keys(full.to_dict())
    assert documented == _fields(Policy), documented ^ _fields(Policy)
    assert full.rate_limit is not None and full.renewal is not None
    assert full.datasets["diabetes"].renewal is not None
    assert set(full.roles.model_fields_set) == set(policies.ROLES)


INVALID = [
    ("[publish]\nmax_epsilonn = 1.0", "publish.max_epsilonn", "unknown key"),
    ("colour = 'blue'", "colour", "unknown key"),
    ("[roles.superuser]\nepsilon = 1.0", "roles.superuser", "roles are admin, data_owner"),
    ("[roles.data_scientist]\nepsilon = -1.0", "roles.data_scientist.epsilon", ">= 0|equal to 0"),
    ("[roles.data_scientist]\nepsilon = nan", "roles.data_scientist.epsilon", "finite"),
    ("[publish]\nmax_epsilon = inf", "publish.max_epsilon", "finite"),
    ("[publish]\nmax_epsilon = true", "publish.max_epsilon", "not bool True"),
    ("[publish]\nmax_epsilon = '1.0'", "publish.max_epsilon", "not str '1.0'"),
    ("[publish]\nmax_epsilon = 'one'", "publish.max_epsilon", "number"),
    ("[users.'a@x.org']\ndelta = 1.0", "users.a@x.org.delta", "less than 1"),
    ("[datasets.d]\nmax_delta = 1.5", "datasets.d.max_delta", "less than 1"),
    ("[datasets.d]\nmax_delta = -1e-9", "datasets.d.max_delta", "equal to 0"),
    (
        "[renewal]\nevery = '1 month'\nanchor = 2026-01-01T00:00:00Z",
        "renewal.every",
        "bad period",
    ),
    ("[renewal]\nevery = '0d'\nanchor = 2026-01-01T00:00:00Z", "renewal.every", "bad period"),
    ("[renewal]\nevery = '30d'\nanchor = 2026-01-01T00:00:00", "renewal.anchor", "UTC offset"),
    ("[renewal]\nevery = '30d'", "renewal.anchor", "required"),
    ("[rate_limit]\nmax_publishes = 5\nwindow = 'hourly'", "rate_limit.window", "bad period"),
    ("[rate_limit]\nmax_publishes = -1\nwindow = '1h'", "rate_limit.max_publishes", "equal to 0"),
    (
        "[datasets.d.renewal]\nevery = '1y'\nanchor = 2026-01-01T00:00:00Z",
        "datasets.d.renewal.every",
        "bad period",
    ),
    ("[users.bob]\nepsilon = 1.0", "users.bob", "not an email"),
    ("[users.'A@x.org']\nepsilon = 1.0\n[users.'a@x.org']\nepsilon = 2.0", "users.", "twice"),
    ("version = 2", "version", "unsupported policy format 2"),
    ("zcdp_delta_share = 1.0", "zcdp_delta_share", "less than 1"),
    ("[publish\nmax_epsilon = 1", "", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "key", "message"), INVALID)
def test_invalid_documents_are_refused_naming_the_key(text: str, key: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(text)
    keys = [k for k, _ in caught.value.problems]
    assert any(k.startswith(key) for k in keys), caught.value
    assert re.search(message, str(caught.value)), caught.value
    if key:
        assert f"{key}" in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy("[publish]\nmax_epsilon = -1\nmax_delta = 2.0\nmax_rho = 1")
    assert sorted(k for k, _ in caught.value.problems) == [
        "publish.max_delta",
        "publish.max_epsilon",
        "publish.max_rho",
    ]


def test_json_and_toml_give_the_same_policy() -> None:
    toml_policy = load_policy(_uncommented())
    via_json = Policy.from_dict(json.loads(toml_policy.to_json()))
    assert via_json == toml_policy
    assert via_json.content_hash() == toml_policy.content_hash()


def test_canonical_form_normalises_spelling() -> None:
    a = load_policy(
        "[renewal]\nevery = '720h'\nanchor = 2026-01-01T02:00:00+02:00\n"
        "[users.'Alice@Example.org']\nepsilon = 2"
    )
    b = load_policy(
        "[users.'alice@example.org']\nepsilon = 2.0\n"
        "[renewal]\nanchor = 2026-01-01T00:00:00Z\nevery = '30d'"
    )
    assert a.to_json() == b.to_json()
    assert a.content_hash() == b.content_hash()
    assert a.to_dict()["renewal"] == {"every": "30d", "anchor": "2026-01-01T00:00:00Z"}


def test_different_content_has_a_different_hash() -> None:
    a = load_policy("[publish]\nmax_epsilon = 1.0")
    b = load_policy("[publish]\nmax_epsilon = 1.5")
    assert a.content_hash() != b.content_hash()


amount = st.floats(min_value=0, max_value=1e6, allow_nan=False)
delta = st.floats(min_value=0, max_value=1, exclude_max=True, allow_nan=False)
documents = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=10),
        "roles": st.fixed_dictionaries(
            {}, optional={"data_scientist": st.fixed_dictionaries({"epsilon": amount})}
        ),
        "users": st.dictionaries(
            st.from_regex(r"[a-z]{1,5}@[a-z]{1,5}\.org", fullmatch=True),
            st.fixed_dictionaries({}, optional={"epsilon": amount, "delta": delta}),
            max_size=3,
        ),
        "publish": st.fixed_dictionaries({}, optional={"max_epsilon": amount, "max_delta": delta}),
        "rate_limit": st.fixed_dictionaries(
            {
                "max_publishes": st.integers(0, 1000),
                "window": st.builds("{}{}".format, st.integers(1, 999), st.sampled_from("smhdw")),
            }
        ),
        "datasets": st.dictionaries(
            st.text(min_size=1, max_size=8).filter(str.strip),
            st.fixed_dictionaries({}, optional={"max_epsilon": amount, "max_delta": delta}),
            max_size=3,
        ),
    },
)


@settings(deadline=None)
@given(documents)
def test_canonical_form_round_trips(data: dict[str, Any]) -> None:
    policy = Policy.from_dict(data)
    again = Policy.from_dict(json.loads(policy.to_json()))
    assert again == policy
    assert again.to_json() == policy.to_json()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["30d", "1h", "2026-01-01T00:00:00Z", "a@b.org"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "roles",
                    "data_scientist",
                    "users",
                    "a@b.org",
                    "epsilon",
                    "delta",
                    "publish",
                    "max_epsilon",
                    "max_delta",
                    "renewal",
                    "every",
                    "anchor",
                    "rate_limit",
                    "max_publishes",
                    "window",
                    "datasets",
                    "d",
                    "approval",
                    "epsilon_above",
                    "zcdp_delta_share",
                    "name",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(deadline=None)
@given(json_values)
def test_any_json_either_validates_or_raises_policy_error(data: Any) -> None:
    """What the API passes in can only produce a policy or a PolicyError naming keys."""
    try:
        policy = Policy.from_dict(data)
    except PolicyError as exc:
        assert exc.problems and all(isinstance(k, str) for k, _ in exc.problems)
    else:
        assert Policy.from_dict(json.loads(policy.to_json())) == policy


def test_an_anchor_before_year_1000_round_trips() -> None:
    # strftime wrote year 999 as "999": the stored text could not be read back, and every
    # budget read, publish and policy change after it failed
    policy = policies.load_policy('[renewal]\nevery = "30d"\nanchor = 0999-01-01T00:00:00Z\n')
    assert policy.to_dict()["renewal"]["anchor"] == "0999-01-01T00:00:00Z"
    assert policies.Policy.from_dict(policy.to_dict()) == policy


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[renewal]\nevery = "3000000d"\nanchor = 2026-01-01T00:00:00Z', "longer than 36500 days"),
        ('[rate_limit]\nmax_publishes = 1\nwindow = "600000w"', "longer than 36500 days"),
        ('[renewal]\nevery = "9999999999999999999999d"\nanchor = 2026-01-01T00:00:00Z', "bad"),
        ('[renewal]\nevery = "1d"\nanchor = 9999-12-31T23:59:59-23:59', "beyond the calendar"),
        ('[renewal]\nevery = "1d"\nanchor = 0001-01-01T00:00:00+23:59', "beyond the calendar"),
        ("x = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ],
)
def test_documents_the_calendar_cannot_hold_are_refused(text: str, message: str) -> None:
    # each was accepted and then made every budget read and publish a 500 (OverflowError),
    # or was a 500 itself (RecursionError)
    with pytest.raises(policies.PolicyError, match=message):
        policies.load_policy(text)
