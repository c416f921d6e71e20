"""Where a conversation's turns go in a thread that holds turns already.

A caller may send a thread whole each time (the conversation so far, with
what is new at its end), or only what is new since its last call, under
the same ``thread_id``. Each call numbers its messages from 0, so the
second way used to put new turns at the thread's first positions: a new
turn with the words of an earlier one (an "ok" said twice) was taken for
it and not stored, and the thread read back out of order. ``first_place``
tells the two ways apart:

* a call at least as long as the thread that opens with its first turn and
  holds at least half of its turns at their places is the thread sent whole (a
  client may have edited or regenerated a turn): numbered from 0, what is
  stored already is found again, and only what is new or changed is stored;
* a call whose turns are the thread's last ones, word for word and in
  order, is a retry of the last call: found again where they are;
* anything else continues the thread after its last turn.

Only a thread the caller names is continued: turns sent with none (seed
003's ``memory_add`` allows that) are numbered from 0, as they always were.

A writer of the same thread at the same moment would place its turns
where the other's go: ``lock`` serialises them, and the write checks,
under the lock, that the placing it embedded for still holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db import connection
from django.db.models import Q

from memories.models import Memory


def turns(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    thread_id: str | None,
    task_id: str | None,
) -> list[tuple[int, str]]:
    """The live turns a writer's thread holds, as (position, content hash), in order.

    In the caller's tenant transaction.
    """
    writer = Q(agent_id__isnull=True) if agent_id is None else Q(agent_id=agent_id)
    rows = (
        Memory.objects.live()
        .filter(
            writer,
            user_id=user_id,
            namespace=namespace,
            thread_id=thread_id,
            task_id=task_id,
            position__isnull=False,
        )
        .order_by("position", "created_at")
        .values_list("position", "content_hash")
    )
    return [(position, digest) for position, digest in rows if position is not None]


def first_place(stored: Sequence[tuple[int, str]], sent: Sequence[str]) -> int:
    """Where the first of ``sent`` goes in a thread holding ``stored`` (position, content
    hash; in position order): the rules in this module's docstring."""
    if not stored or not sent:
        return 0
    last = stored[-1][0]
    held = {position: digest for position, digest in stored}
    same = sum(1 for p, digest in held.items() if sent[p : p + 1] == [digest])
    if len(sent) > last and held.get(0) == sent[0] and 2 * same >= len(held):
        return 0
    tail = stored[-len(sent) :]
    if (
        len(tail) == len(sent)
        and [digest for _, digest in tail] == list(sent)
        and tail[-1][0] - tail[0][0] == len(sent) - 1
    ):
        return tail[0][0]
    return last + 1


def lock(user_id: uuid.UUID | str, namespace: str, thread_id: str | None) -> None:
    """Hold a thread until the writing transaction ends: one writer places its turns
    at a time. Taken first, before the quota and any row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))",
            [f"{user_id}/{namespace}/{thread_id}"],
        )
