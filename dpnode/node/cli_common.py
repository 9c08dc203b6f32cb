"""What the ``dpnode`` commands share: the one-line error, the migrated database, the
password prompt, the operator's name and the number arguments."""

from __future__ import annotations

import argparse
import getpass
import sys
from fractions import Fraction

from dpnode.node.context import NodeContext
from dpnode.node.db import migrate
from dpnode.node.numbers import NONFINITE, is_integer, is_number
from dpnode.node.settings import Settings, get_settings


class CLIError(Exception):
    """A problem to report in one line, with exit status 2."""


def migrated_context(settings: Settings | None = None) -> NodeContext:
    """The node's context on its database, upgraded to the latest schema first."""
    settings = settings or get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    return NodeContext.from_settings(settings)


def password(args: argparse.Namespace) -> str:
    """``--password``, one line of stdin (``--password-stdin``), or asked twice in a terminal.

    Raises:
        CLIError: none given outside a terminal, or the two answers differ.
    """
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if args.password:
        return str(args.password)
    if not sys.stdin.isatty():
        raise CLIError("give --password, --password-stdin, or run in a terminal to be asked")
    first = getpass.getpass("Password: ")
    if first != getpass.getpass("Repeat: "):
        raise CLIError("the passwords differ")
    return first


def add_password_options(parser: argparse.ArgumentParser) -> None:
    """``--password`` or ``--password-stdin`` (neither: asked in a terminal)."""
    pw = parser.add_mutually_exclusive_group()
    pw.add_argument("--password", help="the password (visible in your shell history)")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from stdin")


def operator() -> str:
    """Who runs the command line, for the audit log."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def fmt(units: int, unit: Fraction) -> str:
    """An amount in units, printed as a short decimal.

    >>> fmt(3, Fraction(1, 4))
    '0.75'
    """
    return f"{float(units * unit):.9g}"


# A number argument is read as the API reads one (dpnode.node.numbers): int() and float()
# read '1_0' as 10, ' 5' as 5 and '٣' as 3.


def whole(text: str) -> int:
    """An argparse type: a whole number as JSON writes it."""
    if not is_integer(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number as JSON writes it (ASCII digits, an optional '-')"
        )
    return int(text)


def number(text: str) -> float:
    """An argparse type: a number as JSON writes it (``inf``/``nan`` pass, for the service to
    refuse with its own message)."""
    if not (is_number(text) or text in NONFINITE):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number as JSON writes it (ASCII digits, an optional '-', "
            "fraction and exponent)"
        )
    return float(text)
