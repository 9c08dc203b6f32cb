"""A number or a flag in a query or a path is read as JSON writes it.

Pydantic, reading a query, takes ``1_0``, ``" 1 "``, ``+1``, ``.5`` and ``1.`` as numbers, and
``1``, ``yes``, ``on``, ``t`` or ``True`` as true. :data:`NumberText`, :data:`IntegerText` and
:data:`BoolText` refuse, before pydantic reads it, any text that is not a number as JSON writes
one (:mod:`dpnode.node.numbers`), or ``true`` or ``false``. A query's epsilon or delta may also
be ``inf``, ``-inf`` or ``nan``, as ``str()`` writes them, so that the service refuses them
with its own message, as before. Anything else is refused, 422. A JSON body's numbers and flags
are JSON's already; its schemas take no number or flag as a string
(:mod:`dpnode.node.api.schemas`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from dpnode.node.numbers import INTEGER, NONFINITE, NUMBER, is_integer, is_number, read_id

__all__ = [
    "FLAGS",
    "INTEGER",
    "NONFINITE",
    "NUMBER",
    "BoolText",
    "IntegerText",
    "NumberText",
    "is_integer",
    "is_number",
    "read_id",
]


#: A flag as JSON writes it: pydantic would read these and ten more spellings.
FLAGS = frozenset({"true", "false"})


def _spelled(test: Callable[[str], bool], what: str, kind: str = "number") -> BeforeValidator:
    def check(value: Any) -> Any:
        if isinstance(value, str) and not test(value):
            raise PydanticCustomError(f"{kind}_syntax", f"Input should be {what}")
        return value  # pydantic reads it: the same number (or flag), whichever parser

    return BeforeValidator(check)


# Each goes after the ``Query()`` or ``Path()`` in a parameter's ``Annotated``: before it,
# pydantic could not apply the bounds to the number itself, nor document them as such.

#: A float parameter's text (``inf`` and ``nan`` are the service's to refuse).
NumberText = _spelled(
    lambda text: is_number(text) or text in NONFINITE,
    "a number as JSON writes it (ASCII digits, an optional '-', fraction and exponent; "
    "no '_', '+' or spaces)",
)
#: An int parameter's text.
IntegerText = _spelled(
    is_integer,
    "a whole number as JSON writes it (ASCII digits, an optional '-'; no '_', '+', '.' or spaces)",
)
#: A bool parameter's text.
BoolText = _spelled(FLAGS.__contains__, "true or false, as JSON writes them", "bool")

#: A time as ``datetime.isoformat()`` writes an aware one (RFC 3339: a ``T``, seconds, an
#: optional fraction, ``Z`` or an offset). Pydantic also reads ``1700000000`` as seconds since
#: 1970 and ``20000000000`` as milliseconds, and a space for the ``T``.
TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"
)
#: A time parameter's text.
TimeText = _spelled(
    lambda text: TIME.fullmatch(text) is not None,
    "a time as RFC 3339 writes it, with its offset (2026-11-27T09:30:00Z, "
    "2026-11-27T10:30:00.5+01:00)",
    "datetime",
)
