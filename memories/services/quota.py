"""Counts and the free tier's quota: how many memories a user holds, and may hold."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
from django.db.models.functions import Coalesce

from accounts import tiers
from core import tenancy
from core.admin_tools import count_per_user
from core.errors import (
    QuotaExceeded,
)
from memories.models import (
    Memory,
)

logger = logging.getLogger("memories.services")


def check_quota(
    user_id: uuid.UUID | str, tier: str, adding: int = 1, pending: bool = False
) -> None:
    """Refuse ``adding`` memories that would take the user past their tier's limit, if any.

    With ``pending``, adds already queued count too. The quota is the user's,
    whichever agent writes, and an agent's own view holds only part of the
    user's memories and jobs: database functions count them all, and return
    only numbers (migration 0005). The advisory lock serialises this user's
    free-tier writes so that two concurrent calls at 99 memories cannot both
    pass; the count runs as a statement of its own after it (with a snapshot
    taken once the lock is held), sent in the same round trip.
    """
    limit = tiers.memory_limit(tier)
    if limit is None or not adding:
        return
    used = _used(user_id, pending)
    if used + adding > limit:
        raise full(limit, used=used, adding=adding, pending=pending)


def room(user_id: uuid.UUID | str, tier: str) -> int | None:
    """How many more memories the user may hold (None: no limit), held so until the
    transaction ends: the same lock as ``check_quota``'s."""
    limit = tiers.memory_limit(tier)
    if limit is None:
        return None
    return max(0, limit - _used(user_id, pending=False))


def full(
    limit: int, *, used: int | None = None, adding: int = 1, pending: bool = False
) -> QuotaExceeded:
    """The refusal, saying (when known) what the call would have made: a conversation of 90
    messages refused at 11 memories was told only the limit, which it seemed far from."""
    would = (
        f" You hold {used:,}{' (queued adds included)' if pending else ''},"
        f" and this call would add {adding:,}."
        if used is not None and adding > 1
        else ""
    )
    return QuotaExceeded(
        f"The free tier holds at most {memories_in_words(limit)}.{would} Forget some memories, "
        "or upgrade to a paid tier for unlimited storage."
    )


def memories_in_words(count: int) -> str:
    """A count of memories in words: "1 memory", "100 memories"."""
    return f"{count:,} memory" if count == 1 else f"{count:,} memories"


def _used(user_id: uuid.UUID | str, pending: bool) -> int:
    """The user's memories (and with ``pending`` their queued adds), under their quota lock."""
    counted = (
        "SELECT recall_tenant_memory_count() + recall_tenant_queued_items()"
        if pending
        else "SELECT recall_tenant_memory_count()"
    )
    with connection.cursor() as lock, connection.cursor() as count:
        with tenancy.pipeline(lock):
            lock.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [str(user_id)])
            count.execute(counted)
        return int(count.fetchone()[0])


@dataclass(frozen=True)
class Quota:
    used: int
    limit: int | None  # None: unlimited

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.used / self.limit) if self.limit else None


def memory_quota(*, user_id: uuid.UUID | str, tier: str) -> Quota:
    """Return how many memories the user holds against their tier's limit (tenant path)."""
    with tenancy.tenant(user_id):
        used = Memory.objects.filter(user_id=user_id).count()
    return Quota(used=used, limit=tiers.memory_limit(tier))


def count_memories(*, user_ids: Iterable[uuid.UUID | str]) -> int:
    """Return how many memories these users hold together (operator path)."""
    with tenancy.operator():
        return Memory.objects.filter(user_id__in=list(user_ids)).count()


def memories_per_user() -> Coalesce:
    """Return an annotation counting each user's memories, for a queryset of users.

    A correlated subquery, not a JOIN + GROUP BY, so it can sit beside other
    per-user counts without multiplying rows; PostgreSQL evaluates it after
    the page's LIMIT, one index count per row shown.
    """
    return count_per_user(Memory.objects.all())
