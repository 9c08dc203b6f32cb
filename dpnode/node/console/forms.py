"""Console forms refused on the server: shown again on their page, the message next to the
field it is about, what the user typed kept.

Browsers check what they can (``required``, ``minlength``, ``type=email``) before a form is
sent; the node checks everything again, as the API does, and a refusal is the same page with
the API's status code and message rather than a page of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dpnode.core.errors import InvalidRequestError
from dpnode.node.api.numbers import is_number
from dpnode.node.console.render import refusal
from dpnode.node.console.session import CSRF_FIELD

#: Fixed notices a redirect may ask a page to show (never text taken from the URL).
NOTICES = {
    "approved": "Approved.",
    "denied": "Denied.",
    "applied": "The policy was applied; it is in force from the next publish.",
    "unchanged": "That policy is already in force; nothing was stored.",
    "created": "The account was created.",
    "updated": "The account was updated.",
    # tokens carry no password: those issued before stay valid until they expire
    "password": "The password was changed (signed-in sessions stay valid until they expire).",
    "granted": "The budget was granted.",
}


def notice(done: str | None) -> str:
    """The fixed notice ``done`` names, or none."""
    return NOTICES.get(done or "", "")


#: Fields never shown back in a page: secrets, and the form's own token.
_UNTYPED = frozenset({"password", CSRF_FIELD})


@dataclasses.dataclass(frozen=True)
class FormError:
    """A form the node refused, shown again on its page with the message next to the field
    it is about and what the user typed kept (passwords aside).

    ``form`` names the form on the page (``"page"``: no form there any more, the message goes
    under the page's heading); ``field`` the control the message is about.
    """

    form: str
    field: str
    message: str
    typed: dict[str, str] = dataclasses.field(default_factory=dict)


def form_error(
    exc: Exception, form: str, typed: dict[str, str], fields: Sequence[str]
) -> tuple[int, FormError]:
    """The status and :class:`FormError` of a refused form: the message goes next to the first
    of ``fields`` it names (the API names the field it refuses), else next to the first field.

    >>> from dpnode.core.errors import InvalidRequestError
    >>> status, error = form_error(
    ...     InvalidRequestError("password too short"), "new-user",
    ...     {"email": "a@b.org", "password": "x"}, ["email", "password"])
    >>> status, error.field, error.typed
    (422, 'password', {'email': 'a@b.org'})
    """
    status, message = refusal(exc)
    named = next((f for f in fields if f in message.lower()), fields[0])
    kept = {k: v for k, v in typed.items() if k not in _UNTYPED}
    return status, FormError(form=form, field=named, message=message, typed=kept)


def amount(form: dict[str, str], name: str) -> float | None:
    """The number typed in ``form[name]``, read as JSON writes numbers; empty means none.

    >>> amount({"epsilon": " 0.5 "}, "epsilon"), amount({}, "epsilon")
    (0.5, None)
    """
    raw = form.get(name, "").strip()
    if not raw:
        return None
    if not is_number(raw):  # float() reads 1_0 as 10, and other scripts' digits
        raise InvalidRequestError(f"{name} must be a number such as 0.5 or 1e-6, not {raw!r}")
    return float(raw)
