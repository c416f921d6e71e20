"""What the apps above accounts hold for a user, counted for the users' admin.

Deleting a user takes their memories, usage and billing rows with them, and
the users' list shows each user's memories. Accounts sits below the apps
that own those rows and imports none of them: each registers its counts here
when Django starts (its app config's ``ready()``), and the admin asks.
Deleting an agent takes its memories through the database's cascade, and
deleting a user takes theirs through Django's collector; an app whose writers
lock its rows in an order of their own registers hooks that take them so,
before the cascade or the collector meets them in its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from django.db.models import Expression, Value

# Takes the users' ids as ``user_ids=`` and returns how many rows they hold.
Counter = Callable[..., int]
# Returns an annotation counting each user's rows, for a queryset of users.
PerUser = Callable[[], Expression]

# Takes ``user_id=`` and ``agent_id=`` in the transaction that deletes the
# agent, before the delete.
BeforeAgentDeleted = Callable[..., None]
# Takes ``user_ids=`` in the transaction that deletes the users, before the delete.
BeforeUsersDeleted = Callable[..., None]

_counters: dict[str, Counter] = {}
_per_user: dict[str, PerUser] = {}
_before_agent_deleted: dict[str, BeforeAgentDeleted] = {}
_before_users_deleted: dict[str, BeforeUsersDeleted] = {}


def register(
    label: str,
    counter: Counter,
    per_user: PerUser | None = None,
    before_agent_deleted: BeforeAgentDeleted | None = None,
    before_users_deleted: BeforeUsersDeleted | None = None,
) -> None:
    _counters[label] = counter
    if per_user is not None:
        _per_user[label] = per_user
    if before_agent_deleted is not None:
        _before_agent_deleted[label] = before_agent_deleted
    if before_users_deleted is not None:
        _before_users_deleted[label] = before_users_deleted


def agent_deleting(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str) -> None:
    """Run every registered hook for an agent about to be deleted, in its transaction."""
    for hook in _before_agent_deleted.values():
        hook(user_id=user_id, agent_id=agent_id)


def users_deleting(user_ids: Iterable[uuid.UUID | str]) -> None:
    """Run every registered hook for users about to be deleted, in their transaction."""
    ids = list(user_ids)
    for hook in _before_users_deleted.values():
        hook(user_ids=ids)


def count(user_ids: Iterable[uuid.UUID | str]) -> dict[str, int]:
    """Return each registered holding's count for these users, by label."""
    ids = list(user_ids)
    return {label: counter(user_ids=ids) for label, counter in _counters.items()}


def per_user(label: str) -> Expression:
    """Return the annotation counting each user's ``label``, or 0 when none is registered."""
    made = _per_user.get(label)
    return made() if made is not None else Value(0)
