"""Which memories replaced which, as the dashboard shows them (issue 22).

Lookups only: ``superseding`` makes and undoes the links these read.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from core import tenancy
from memories.models import Memory, MemoryHistory


def replaced_by_each(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, ids: Sequence[str]
) -> dict[str, list[str]]:
    """Return, for each of ``ids``, the memories it replaced."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = Memory.objects.filter(user_id=user_id, superseded_by__in=wanted).values_list(
            "superseded_by", "id"
        )
        out: dict[str, list[str]] = {}
        for new, old in rows:
            out.setdefault(str(new), []).append(str(old))
    return out


def still_replaced(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, ids: Sequence[str]
) -> set[str]:
    """Return which of ``ids`` are replaced now (a delete in the middle of a chain passes
    what the deleted memory replaced on to the next step: it stays replaced)."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = Memory.objects.filter(
            user_id=user_id, id__in=wanted, superseded_by__isnull=False
        ).values_list("id", flat=True)
        return {str(i) for i in rows}


def with_history(*, user_id: uuid.UUID | str, ids: Sequence[str]) -> set[str]:
    """Return which of ``ids`` have a history to show, in one query: a memory's history can
    be erased (after it was deleted) while another memory's history still names it."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    with tenancy.tenant(user_id):
        rows = (
            MemoryHistory.objects.filter(user_id=user_id, memory_id__in=wanted)
            .values_list("memory_id", flat=True)
            .distinct()
        )
        return {str(i) for i in rows}
