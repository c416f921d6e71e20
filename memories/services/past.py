"""``as_of`` from the history: each memory a search returns, shown as it was at T (issue 22).

The search picks what was held true at T from the memories' own columns
(``Filters.held()``: created by then, not yet replaced then) and ranks it on
the current vectors. This module then reads, in one statement for all the
results, each one's version at T from ``memory_history`` (every change of a
memory writes a row there: content, metadata, priority and what replaced it
at that version, with the moment it was recorded), in the caller's tenant
transaction, under the same row-level security as the search.

The version at T is the memory's latest history row recorded at or before
T (to the millisecond, as ``Filters.until``). A memory created by T whose
history begins after T (its ``created`` row is recorded by the statement
that inserts it, which may come after its transaction began, its
``created_at``; a memory brought from elsewhere may carry a later history)
is shown as its first version: the earliest the history knows.

A memory whose history says it was replaced at T, though its columns say
it is current now (restored, or its replacement forgotten, since), was not
held true then: it is left out, as any memory replaced at T is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from memories.filters import Filters
from memories.services.shapes import Metadata, Recalled

# Per memory, its latest version recorded before the moment; when none is,
# its first. "Replaced" only from a row really recorded by then. "Matches":
# the search's metadata and priority filters, on that version (as the
# search applies them to a memory now: containment, in the database).
VERSIONS_AT = """
    SELECT DISTINCT ON (h.memory_id)
           h.memory_id, h.version, h.content, h.metadata::text, h.priority,
           h.recorded_at < %(until)s AND h.superseded_by IS NOT NULL AS replaced,
           (%(metadata)s::jsonb IS NULL OR h.metadata @> %(metadata)s::jsonb)
           AND (%(priorities)s::text[] IS NULL OR h.priority = ANY(%(priorities)s::text[]))
           AS matches
    FROM memory_history AS h
    WHERE h.memory_id = ANY(%(ids)s::uuid[]) AND h.user_id = %(user)s AND h.action <> 'deleted'
    ORDER BY h.memory_id, h.recorded_at < %(until)s DESC,
             CASE WHEN h.recorded_at < %(until)s THEN h.version ELSE -h.version END DESC
"""


@dataclass(frozen=True)
class Then:
    """One memory as its history holds it at a moment."""

    version: int
    content: str
    metadata: Metadata
    priority: str
    replaced: bool  # a later memory replaced it then
    matches: bool = True  # the search's metadata and priority filters, then


def versions_at(
    user_id: uuid.UUID | str,
    ids: Sequence[uuid.UUID | str],
    until: datetime,
    filters: Filters | None = None,
) -> dict[str, Then]:
    """Return each memory's version at ``until`` (exclusive), by id: one statement;
    with ``filters``, whether that version meets their metadata and priorities.

    Runs in the caller's open tenant transaction. A memory the history has
    no row of (none the caller may read) is absent.
    """
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            VERSIONS_AT,
            {
                "ids": [str(i) for i in ids],
                "user": str(user_id),
                "until": until,
                "metadata": json.dumps(filters.metadata) if filters and filters.metadata else None,
                "priorities": list(filters.priorities) if filters and filters.priorities else None,
            },
        )
        rows = cursor.fetchall()
    return {
        str(memory_id): Then(version, content, json.loads(metadata), priority, replaced, matches)
        for memory_id, version, content, metadata, priority, replaced, matches in rows
    }


def shown(found: Recalled, then: Then | None, current: int) -> Recalled | None:
    """A result as it was at the moment: None when it was not held true then, or when
    that version does not meet the search's metadata and priority filters (which the
    search applied to the memory now: a result meets them both now and then).

    ``current`` is the memory's version now, shown when its history has no
    row to answer from (so ``version`` always names the content shown).
    """
    # A newer result's mark reads today's contents, not the moment's: never shown here.
    found = found.copy()
    found.pop("may_be_replaced_by", None)
    if then is None:
        return {**found, "version": current}
    if then.replaced or not then.matches:
        return None
    return {
        **found,
        "content": then.content,
        "metadata": then.metadata,
        "priority": then.priority,
        "version": then.version,
    }
