"""What the apps above accounts hold for a user, counted for the users' admin.

Deleting a user takes their memories, usage and billing rows with them, and
the users' list shows each user's memories. Accounts sits below the apps
that own those rows and imports none of them: each registers its counts here
when Django starts (its app config's ``ready()``), and the admin asks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from django.db.models import Expression, Value

# Takes the users' ids as ``user_ids=`` and returns how many rows they hold.
Counter = Callable[..., int]
# Returns an annotation counting each user's rows, for a queryset of users.
PerUser = Callable[[], Expression]

_counters: dict[str, Counter] = {}
_per_user: dict[str, PerUser] = {}


def register(label: str, counter: Counter, per_user: PerUser | None = None) -> None:
    _counters[label] = counter
    if per_user is not None:
        _per_user[label] = per_user


def count(user_ids: Iterable[uuid.UUID | str]) -> dict[str, int]:
    """Return each registered holding's count for these users, by label."""
    ids = list(user_ids)
    return {label: counter(user_ids=ids) for label, counter in _counters.items()}


def per_user(label: str) -> Expression:
    """Return the annotation counting each user's ``label``, or 0 when none is registered."""
    made = _per_user.get(label)
    return made() if made is not None else Value(0)
