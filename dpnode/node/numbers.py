"""A number written as text (a query, a path, a form field, an option) is read as JSON writes it.

Parsers disagree on which texts are numbers: Python's ``float`` and ``int`` read ``1_0`` as
10 and take surrounding spaces, Arabic-Indic and fullwidth digits, and ``str.isdigit`` takes
``²`` (which ``int`` cannot read); pydantic, reading a query, takes ``1_0``, ``" 1 "``,
``+1``, ``.5`` and ``1.``. The node answers every request as a release, so it reads only the
one spelling every parser agrees on: ASCII digits as JSON writes a number, with an optional
``-``, fraction and exponent (``0.5``, ``-2``, ``1e-06``: what ``str()`` of a Python number
gives). The HTTP layer's checks of query and path parameters are in
:mod:`dpnode.node.api.numbers`. This module sits below the HTTP layer, so that services and the
command line read the same way: a text that names a user or a dataset by id or else by email or
name is an id only if :func:`read_id` reads one.
"""

from __future__ import annotations

import re

from dpnode.node.db.models import MAX_ID

__all__ = [
    "DIGITS",
    "INTEGER",
    "NONFINITE",
    "NUMBER",
    "is_integer",
    "is_number",
    "looks_like_id",
    "read_id",
]

#: RFC 8259's number (``[0-9]`` is ASCII: ``\d`` would take any script's digits).
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
#: ... without a fraction or an exponent.
INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
#: ASCII digits alone.
DIGITS = re.compile(r"[0-9]+")
#: The floats JSON cannot hold, as ``str()`` writes them (a client's ``epsilon=nan``): where
#: an epsilon or a delta is read from text, they are taken so that the service refuses them
#: with its own message.
NONFINITE = frozenset({"inf", "-inf", "nan"})


def is_number(text: str) -> bool:
    """Whether ``text`` is a number as JSON writes it.

    >>> [is_number(t) for t in ("0.5", "-2", "1e-06", "1E+3", "-0")]
    [True, True, True, True, True]
    >>> [is_number(t) for t in ("1_0", " 1", "+1", ".5", "1.", "01", "inf", "\\u0661", "\\uff11")]
    [False, False, False, False, False, False, False, False, False]
    """
    return NUMBER.fullmatch(text) is not None


def is_integer(text: str) -> bool:
    """Whether ``text`` is a whole number as JSON writes it: digits, perhaps a ``-``.

    >>> [is_integer(t) for t in ("7", "-0", "7.0", "1e3", "07", "\\u00b2", "")]
    [True, True, False, False, False, False, False]
    """
    return INTEGER.fullmatch(text) is not None


def read_id(text: str) -> int | None:
    """The id ``text`` spells as JSON writes a whole number; None if it spells none, or a
    negative one, or one beyond any id (:data:`~dpnode.node.db.models.MAX_ID`).

    >>> read_id("42"), read_id("0"), read_id("042"), read_id("-1"), read_id("\u00b2")
    (42, 0, None, None, None)
    >>> read_id("2147483648"), read_id("9" * 5000)  # int() raises beyond 4300 digits
    (None, None)
    """
    if len(text) > len(str(MAX_ID)) or not is_integer(text) or text.startswith("-"):
        return None
    found = int(text)
    return found if found <= MAX_ID else None


def looks_like_id(text: str) -> bool:
    """Whether ``text`` is ASCII digits alone: every text :func:`read_id` reads as an id, and
    those it does not only for a leading zero or for being beyond any id today. A dataset or
    model may not be named so, where a path reads a name or an id from one text.

    >>> [looks_like_id(t) for t in ("42", "042", "9" * 30, "-1", "4a", "\u0661\u0662", "\u00b2")]
    [True, True, True, False, False, False, False]
    """
    return DIGITS.fullmatch(text) is not None
