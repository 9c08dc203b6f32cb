"""Every error code the node can send has its own SDK exception, in the same place of the tree."""

from __future__ import annotations

import dpnode.core.errors
import dpnode.core.privacy  # registers PrivacyTrackingError, a subclass of GraphError
import dpnode.sdk._exceptions as client


def _all(cls: type[dpnode.core.errors.DPNodeError]) -> list[type[dpnode.core.errors.DPNodeError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += _all(sub)
    return found


def test_every_node_code_maps_to_a_class_of_the_same_name_and_parent() -> None:
    node_classes = [
        c for c in _all(dpnode.core.errors.DPNodeError) if c is not dpnode.core.errors.DPNodeError
    ]
    assert len(node_classes) >= 14
    for cls in node_classes:
        mapped = client.BY_CODE.get(cls.code)
        assert mapped is not None, f"the SDK has no exception for the node's {cls.code!r}"
        assert mapped.__name__ == cls.__name__
        parent = cls.__mro__[1]
        assert mapped.__mro__[1].__name__ == parent.__name__, cls
        assert mapped.__name__ in client.__all__


def test_an_unknown_code_still_raises_a_typed_error() -> None:
    err = client.error_for(418, "teapot", "short and stout")
    assert type(err) is client.DPNodeError and err.code == "teapot" and err.status == 418


def test_a_retry_after_is_seconds_in_ascii_digits() -> None:
    # isdigit() took '²' (int() raised: a ValueError in place of the node's error) and '١'
    for header in ("²", "١", "1²", " +1", "1.5", "9" * 5000, "Wed, 21 Oct 2026 07:28:00 GMT"):
        err = client.error_for(503, "overloaded", "busy", headers={"Retry-After": header})
        assert type(err) is client.NodeBusyError and err.retry_after is None, header
    err = client.error_for(429, "rate_limited", "wait", headers={"Retry-After": "007"})
    assert err.retry_after == 7
