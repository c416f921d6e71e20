"""Forms that make a key, sent once: a reload of the page that showed the new key makes none.

Each such form carries a fresh random token (``once``). The session remembers
the tokens of the forms it sent, so the same form sent again is told apart
from a new one. Used by the dashboard's key form and the admin's "Add API key".
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.sessions.backends.db import SessionStore
from django.db import connection, transaction
from django.http import HttpRequest

# How many sent key forms a session remembers: a reload is of a recent one.
SPENT_FORMS = 20
KEY = "spent_key_forms"


def sent_before(request: HttpRequest, once: str) -> bool:
    """Whether this key form was sent before in this session; records it as sent.

    Read and written in the session's row under a lock of its own: the session
    a request carries was read when it began, so two sends at once (a double
    click) each found the form unsent, and each made a key.
    """
    before = _change(
        request, once, lambda spent: spent if once in spent else [*spent, once][-SPENT_FORMS:]
    )
    return once in before


def unspend(request: HttpRequest, once: str) -> None:
    """Forget that this key form was sent: the send made no key, and sending it again may."""
    _change(request, once, lambda spent: [token for token in spent if token != once])


def _change(request: HttpRequest, once: str, change: Callable[[list[str]], list[str]]) -> list[str]:
    """Apply ``change`` to the session's spent tokens as stored, under the session's lock;
    return them as they were."""
    if not once or request.session.session_key is None:
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 3))",
            [f"key-form/{request.session.session_key}"],
        )
        stored = SessionStore(session_key=request.session.session_key)
        spent: list[str] = stored.get(KEY, [])
        changed = change(spent)
        if changed != spent:
            stored[KEY] = changed
            stored.save()
    request.session[KEY] = changed
    return spent
