"""A write that names the memory it replaces (``replaces``): the id read, and checked.

``check_replaces`` runs inside the writing transaction, before the write
stores anything, so a wrong id writes nothing; ``replaceable`` is the rule a
link must keep whichever way it is made (``superseding.link`` asks it too).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connection

from core.errors import Conflict, NotFound, ValidationFailed
from memories import validation
from memories.models import Memory, SourceKind

# What the history of a memory whose replacement is deleted says: the key's
# ON DELETE SET NULL makes it current again, recorded as "restored".
FREED = {"decided_by": "deletion", "reason": "the memory that replaced it was deleted"}
FREED_BY_EXPIRY = {"decided_by": "expiry", "reason": "the memory that replaced it expired"}


def parse_replaces(value: object) -> uuid.UUID | None:
    if value is None:
        return None
    try:
        return validation.memory_id(value)
    except ValidationFailed:
        raise ValidationFailed("replaces must be a memory id (a UUID string).") from None


# /v1/mcp's seed calls the namespace user_id: the message names both.
_SAME_WRITER = (
    "replaces must name a memory of the same namespace (user_id on /v1/mcp),"
    " written by the same writer."
)


def check_replaces(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    old: uuid.UUID,
    task_id: str | None = None,
    found: uuid.UUID | None = None,
    *,
    free: bool = True,
) -> bool:
    """Check, inside the caller's tenant transaction, that a write may replace ``old``.

    It must be a memory the caller can see (else NotFound: another tenant's
    or agent's id is indistinguishable from none), of the same namespace and
    writer, a note of the same task as the write (``task_id``) or of none,
    and current: the pairs detection and newer first take. ``found`` is the
    memory already holding the write's content, which the link will change.
    Return True when ``old`` is replaced by ``found`` already: the same call
    again (a retry, a hint taken twice), whose link stands. A holder that has
    expired, with nothing live after it, is no obstacle: with ``free``, ``old``
    is made current here, as the purge would; without (a check before
    queuing), the job's run does it. With a live memory after it, ``old``
    passes on along the chain when the purge runs: a Conflict naming the latest.
    """
    # Locked, as ``lock`` does, before the write stores anything: the answer
    # holds until the link is written, and the lock order stays rows first.
    # With ``found``, both in one statement in id order, as every writer of
    # two memories takes them: the link's update of ``found`` came after
    # ``old`` whatever their ids, and a delete of both could wait on it.
    rows = (
        Memory.objects.live()
        .select_for_update(no_key=True)
        .filter(user_id=user_id, id__in=sorted({old, *([found] if found else [])}))
        .order_by("id")
        .values("id", "namespace", "agent_id", "superseded_by", "source_kind", "task_id")
    )
    row = next((r for r in rows if r["id"] == old), None)
    if row is None and task_id and _lent(user_id, old, task_id):
        # Another agent's note lent through the write's task: seen, but not the
        # writer's to change.
        raise ValidationFailed(_SAME_WRITER)
    if row is None:
        raise NotFound(f"No memory with id {old} to replace.")
    writer = str(agent_id) if agent_id else None
    owner = str(row["agent_id"]) if row["agent_id"] else None
    if row["namespace"] != namespace or owner != writer:
        raise ValidationFailed(_SAME_WRITER)
    replaceable(old, row, task_id)
    if row["superseded_by"] is not None and row["superseded_by"] == found:
        return True
    if row["superseded_by"] is not None and _free_if_expired(
        user_id, old, row["superseded_by"], free
    ):
        return False
    if row["superseded_by"] is not None:
        raise Conflict(
            f"Memory {old} is already replaced by {row['superseded_by']}; replace that one."
        )
    return False


def _lent(user_id: uuid.UUID | str, memory_id: uuid.UUID, task_id: str) -> bool:
    """Whether ``memory_id`` is a live note the writer may read through ``task_id``: one
    of another agent's, which the write's own (unlent) view does not hold."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('app.current_task_id', true),"
            " set_config('app.current_task_id', %s, true)",
            [task_id],
        )
        (before, _) = cursor.fetchone()
        # Not restored on a failure: the transaction is lost then, the setting with it,
        # and a statement in it would hide the failure behind "transaction aborted".
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM memories WHERE user_id = %s AND id = %s"
            " AND (expires_at IS NULL OR expires_at > statement_timestamp()))",
            [str(user_id), memory_id],
        )
        (lent,) = cursor.fetchone()
        cursor.execute("SELECT set_config('app.current_task_id', %s, true)", [before or ""])
    return bool(lent)


# An expired memory, and the latest live step of its chain after it, if any: the
# purge removes the expired steps and passes each older memory on to the next
# live one, so that step is where the chain ends once it runs (A -> B -> C -> D,
# B and D expired: C). The walk is bounded, were links ever to loop.
_EXPIRED_HOLDER = (
    "WITH RECURSIVE later AS ("
    " SELECT superseded_by AS id, 1 AS depth FROM memories WHERE user_id = %s AND id = %s"
    " AND expires_at <= statement_timestamp()"
    " UNION ALL SELECT m.superseded_by, later.depth + 1 FROM memories m"
    " JOIN later ON m.id = later.id WHERE m.user_id = %s AND later.depth < 1000)"
    " SELECT (SELECT e.id FROM memories e JOIN later ON e.id = later.id"
    " WHERE e.expires_at IS NULL OR e.expires_at > statement_timestamp()"
    " ORDER BY later.depth DESC LIMIT 1)"
    " FROM later LIMIT 1"
)


def _free_if_expired(
    user_id: uuid.UUID | str, old: uuid.UUID, holder: uuid.UUID, free: bool = True
) -> bool:
    """Make ``old`` current now if ``holder``, what replaced it, has expired with nothing
    live after it; say whether. With a live memory after it: a Conflict naming the latest.

    The purge would free it within a minute (``FREED_BY_EXPIRY``); until then the
    expired holder is no tool's to name, so a write naming ``old`` was told to replace
    a memory it could not. ``old`` is locked by the caller; the holder is only read
    (an expired memory changes no more), so the lock order stays as it was.
    """
    with connection.cursor() as cursor:
        cursor.execute(_EXPIRED_HOLDER, [str(user_id), holder, str(user_id)])
        found = cursor.fetchone()
        if found is None:
            return False
        if found[0] is not None:
            # A live memory stands after the expired one: ``old`` passes on along the
            # chain when the purge runs, so it is replaced already, by that memory.
            raise Conflict(f"Memory {old} is already replaced by {found[0]}; replace that one.")
        if not free:
            return True
        cursor.execute(
            "SELECT set_config('app.supersession', %s, true)", [json.dumps(FREED_BY_EXPIRY)]
        )
        cursor.execute(
            "UPDATE memories SET superseded_by = NULL WHERE id = %s AND user_id = %s",
            [old, str(user_id)],
        )
        cursor.execute("SELECT set_config('app.supersession', '', true)")
    return True


def replaceable(memory_id: object, row: Mapping[str, Any], task_id: str | None) -> None:
    """Refuse to replace what no later note replaces: a conversation's message or a
    document's chunk (a later message adds to a conversation), or a note of another task
    (a task's notes are lent to every agent naming it; replaced from outside the task, one
    would vanish for them without showing what replaced it)."""
    if row["source_kind"] != SourceKind.NOTE:
        kind = {"conversation": "a conversation's message", "document": "a document's chunk"}
        raise ValidationFailed(
            f"Memory {memory_id} is {kind.get(row['source_kind'], 'not a note')}: "
            "only a note replaces or is replaced."
        )
    if row["task_id"] != task_id:
        whose = "another task" if row["task_id"] else "no task"
        raise ValidationFailed(
            f"Memory {memory_id} is a note of {whose}: a note replaces only a note of its"
            " own task (both of one task, or both of none)."
        )
