"""Knowledge updates (issue 22): a later memory replaces an older one, marked, never deleted.

A link is ``memories.superseded_by`` (and ``superseded_at``) on the older
memory; what a memory replaced is ``WHERE superseded_by = its id``. The
database keeps links inside one user, namespace and writer and records them
in ``memory_history`` (migration 0014); this module decides when to link:

* explicitly: ``remember(replaces=id)`` and its siblings name the memory;
  ``naming.check_replaces`` validates it inside the writing transaction, so a wrong
  id writes nothing;
* on write: a single note is compared with the few nearest current notes of
  its namespace and writer (``nearest``, one statement inside the writing
  transaction) by the offline detector (``memories/supersession``); a
  confident ``supersede`` links, anything else keeps both; the kept
  candidates with some evidence of a new value (``Decision.hint``) are named
  in the write's result, ``may_replace``, for the calling agent to judge
  (``remember`` again with ``replaces`` links one);
* by a chat model, only when one is configured (``RECALL_SUPERSESSION=llm``)
  and the detector left a candidate ambiguous: after the write commits, with
  a timeout, falling back to keeping both (``settle_with_model``).

``restore`` undoes a link. ``RECALL_SUPERSESSION=off`` turns detection off;
explicit links still work.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from django.conf import settings
from django.db import IntegrityError, connection

from core import tenancy
from core.errors import Conflict, LostRace, NotFound, ValidationFailed
from core.timestamps import iso
from memories import embeddings, search, validation
from memories.models import Memory, SourceKind
from memories.services.naming import FREED_BY_EXPIRY, replaceable
from memories.services.shapes import Hinted
from memories.supersession import Candidate, Decision, decide, hints

logger = logging.getLogger("memories.services")

# How many of the nearest current notes a write compares itself with.
CANDIDATES = 5
# Read a few more than that: the nearest may include other writers' memories
# (user-wide, every agent's) or conversation turns, which are never replaced.
NEAREST = 8
# How many times a write looks for what it replaces, when another write
# replaced all it found while it waited for their rows.
LOOKS = 3
# What a write that looks for candidates opens its transaction with, as a
# search's does (search.transaction_settings): the nearest through the index,
# never by reading and sorting the namespace, at a breadth enough for a
# handful of neighbours (recall reads 50 deep). Set with the tenant, in the
# transaction's first round trip; the write's other statements are lookups
# by key, which these settings leave as they are.
SETTINGS = {"enable_sort": "off", "enable_seqscan": "off", "hnsw.ef_search": "40"}


def detects(call_is_note: bool, named: bool) -> bool:
    """Whether a write looks for what it replaces: a note, not named, detection on."""
    return call_is_note and not named and mode() != "off"


@dataclass(frozen=True)
class Link:
    """An older memory a new one replaces, and why (recorded in both histories)."""

    old: uuid.UUID
    decision: dict[str, Any]


@dataclass(frozen=True)
class Pending:
    """What the offline rules left open for a chat model: the new text and the candidates."""

    content: str
    candidates: tuple[Candidate, ...]
    decisions: tuple[Decision, ...]


def mode() -> str:
    """``off``, ``offline`` (the default) or ``llm``."""
    return str(getattr(settings, "RECALL_SUPERSESSION", "offline"))


def nearest(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    vector: np.ndarray,
    task_id: str | None = None,
    author: str = "",
) -> list[Candidate]:
    """Return the nearest current notes of the namespace, writer, task and author, with their
    cosine.

    The dense half of the search (exact under the cut-off, HNSW above it),
    ids, texts and similarities only, in the caller's open transaction.

    Of one task (or of none, as the new note): a note filed under a task is
    lent to every agent that names the task, and a note of another task (or
    of none) that replaced it would hide it from them without showing them
    what replaced it. Of one author (seed 003's ``author``, or none): notes a
    client attributes to different people are different sources, and one
    replacing the other hid a true note ("Meeting notes by Dana: ..." by
    Erik's).
    """
    embedder = embeddings.get_embedder()
    probe = search.Search(
        text="",
        vector=vector,
        embedder=embedder,
        mode="semantic",
        limit=NEAREST,
        minimum=0.0,
        # A task's notes are found inside the scan, so that other notes do
        # not take the nearest places; notes of no task are told apart below.
        filters=search.Filters(namespace, sources={"task_id": task_id} if task_id else {}),
    )
    ctes, params = search.nearest_ctes(probe, NEAREST, agent=agent_id is not None)
    writer = "agent_id = %(writer)s" if agent_id else "agent_id IS NULL"
    untasked = "" if task_id else " AND task_id IS NULL"
    # S608: the CTEs are built from constants; values are parameters.
    sql = (
        f"WITH {ctes} SELECT id, content, 1 - distance FROM nearest"  # noqa: S608
        f" WHERE {writer} AND source_kind = %(note)s{untasked}"
        " AND coalesce(author, '') = %(author)s ORDER BY distance LIMIT %(top)s"
    )
    params.update(
        user=str(user_id),
        writer=str(agent_id) if agent_id else None,
        note=SourceKind.NOTE.value,
        author=author or "",
        top=CANDIDATES,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [Candidate(str(i), c, float(s)) for i, c, s in cursor.fetchall()]


@dataclass(frozen=True)
class Detected:
    """What a write's detection found: links to make, a chat model's share, hints."""

    links: list[Link]
    pending: Pending | None = None
    hints: tuple[Hinted, ...] = ()  # kept candidates that may hold an earlier value


def detect(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    namespace: str,
    content: str,
    vector: np.ndarray,
    task_id: str | None = None,
    author: str = "",
) -> Detected:
    """Decide, in the writing transaction, which current notes a new note replaces.

    Returns the confident links, their memories locked (``lock``); what a
    chat model may settle (only in ``llm`` mode, only candidates the rules
    left ambiguous); and the kept candidates worth naming to the caller
    (``supersession.hints``).
    """
    if mode() == "off":
        return Detected([])
    for _ in range(LOOKS):
        # The transaction opened with SETTINGS (store() does).
        candidates = nearest(user_id, agent_id, namespace, vector, task_id, author)
        if not candidates:
            return Detected([])
        decisions = decide(content, candidates)
        confident = [d for d in decisions if d.verdict == "supersede"]
        links = lock(user_id, [Link(uuid.UUID(d.id), _decision("offline", d)) for d in confident])
        # Only when no link is left: with some rows held, locking a newer memory
        # now would take rows out of id order. Then the write keeps the links it
        # holds, and a newer value that replaced one of the others stays current
        # beside it: two current values, as the same race left them before.
        if links or not confident:
            break
        # All it would replace was replaced (or forgotten) by a write that
        # committed while this one waited for the rows: a later value of the
        # same fact, stored a moment before. Look again, as a write that came
        # after it would; this write holds no row yet, so the order stays.
    pending = None
    if mode() == "llm" and any(d.ambiguous and d.verdict == "keep" for d in decisions):
        pending = Pending(content, tuple(candidates), tuple(decisions))
    texts = {c.id: c.content for c in candidates}
    named = hints(decisions)
    return Detected(links, pending, tuple({"id": d.id, "content": texts[d.id]} for d in named))


def lock(user_id: uuid.UUID | str, links: Sequence[Link]) -> list[Link]:
    """Lock the memories ``links`` would replace, in id order; return the links still current.

    Called in the writing transaction before it stores the new memory. Every
    other writer of a memory (forget, update, a cascade) takes the memory's
    row first and the namespace's search statistics after (the statement's
    triggers); storing a memory takes the statistics. Linking only after the
    insert took the same two the other way round, a deadlock (40P01) that
    failed whichever call PostgreSQL picked. Taking the rows first, in one
    order, keeps a single order everywhere. A memory forgotten or replaced
    meanwhile drops out, so the new memory's history names only what it
    replaces.
    """
    if not links:
        return []
    held = _lock_current(user_id, [link.old for link in links])
    return [link for link in links if link.old in held]


def _lock_current(user_id: uuid.UUID | str, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Lock the memories ``ids`` that are current, in one statement in id order; return them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = %s AND id = ANY(%s)"
            " AND superseded_by IS NULL ORDER BY id FOR NO KEY UPDATE",
            [str(user_id), list(ids)],
        )
        return {row[0] for row in cursor.fetchall()}


def _decision(by: str, d: Decision, model: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"decided_by": by, "reason": d.reason, "score": round(d.score, 3)}
    if model:
        out["model"] = model
    return out


def freeing(cursor: Any, why: dict[str, str] | None) -> None:
    """Name, for the delete that follows, why the memories it replaced are current again
    (their ``restored`` history rows); None after it."""
    cursor.execute(
        "SELECT set_config('app.supersession', %s, true)", [json.dumps(why) if why else ""]
    )


# A delete locks its rows first, by id, then deletes them; with them, the
# memories they replace. Deleting a memory clears the link of the memory it
# replaced (ON DELETE SET NULL), an update of that row too. A write that
# takes two memories (``lock``, ``link``, ``restate``: a replaced memory and
# the end of its chain) locks them in id order; a delete taking its own row
# and then, in the cascade, the row it replaced could hold one the write
# needs next while it waits for one the write holds: a deadlock (40P01) that
# fails one of the two calls. So every row the statement will change is
# locked in one statement, in id order. RETURNING rather than Django's
# ``delete()``, to purge exactly what went. Each names the user, and
# row-level security adds the user's own condition on top. (The operator's
# expiry purge, which must never wait, skips what is locked instead:
# ``maintenance._purge_batch``.)
_LOCK_DOOMED = (
    # With what replaced each doomed memory: the next step that stays, which the
    # memories they replaced pass on to (``_pass_on``), is among those.
    "SELECT id FROM memories WHERE user_id = %s AND (id IN ({doomed})"
    " OR superseded_by IN ({doomed}) OR id IN (SELECT superseded_by FROM memories"
    " WHERE user_id = %s AND id IN ({doomed}))) ORDER BY id FOR UPDATE"
)
# Each memory a doomed one replaced, and the next step of its chain that the
# delete leaves (walking on through the doomed only): the memory it passes on to.
_PASSING_ON = (
    "WITH RECURSIVE walk AS ("
    " SELECT a.id AS start, a.superseded_by AS at FROM memories a WHERE a.user_id = %s"
    " AND a.superseded_by IN ({doomed}) AND a.id NOT IN ({doomed})"
    # UNION, not UNION ALL: were links ever to loop, the walk would still end.
    " UNION SELECT walk.start, m.superseded_by FROM walk JOIN memories m ON m.id = walk.at"
    " WHERE m.user_id = %s AND m.id IN ({doomed}) AND m.superseded_by IS NOT NULL)"
    " SELECT walk.start, walk.at FROM walk WHERE walk.at NOT IN ({doomed})"
)
_DELETE_LOCKED = (
    "DELETE FROM memories WHERE id IN ({doomed})"
    " RETURNING id, expires_at IS NULL OR expires_at > statement_timestamp()"
)


class Gone(NamedTuple):
    """What a delete removed: every memory's id, and how many had not expired yet."""

    ids: list[uuid.UUID]
    live: int


# The namespaces a delete spans, in the order the search generation's trigger
# takes them (the database's collation, not Python's).
_DOOMED_NAMESPACES = (
    "SELECT DISTINCT namespace FROM memories WHERE user_id = %s AND id IN ({doomed})"
    " ORDER BY namespace"
)
_DOOMED_IN = "SELECT id FROM memories WHERE user_id = %s AND namespace = %s AND id IN ({doomed})"


def delete_freeing(
    cursor: Any,
    doomed: str,
    params: Sequence[Any],
    why: dict[str, str],
    *,
    across_namespaces: bool = False,
) -> Gone:
    """Delete the memories the query ``doomed`` selects and say which (``Gone``); those
    they replaced are current again, their history saying ``why``.

    ``params`` are ``doomed``'s, the user first. Runs in the caller's transaction.
    A delete that may span namespaces (``across_namespaces``) goes one namespace at
    a time, in the order every statement takes their search generations: passing a
    chain on in one and then deleting in an earlier one took two generations the
    other way round from a writer of both, and deadlocked with it.
    """
    if not across_namespaces:
        return _delete_freeing(cursor, doomed, params, why)
    user = params[0]
    cursor.execute(_DOOMED_NAMESPACES.format(doomed=doomed), [user, *params])
    ids: list[uuid.UUID] = []
    live = 0
    for (namespace,) in cursor.fetchall():
        gone = _delete_freeing(
            cursor, _DOOMED_IN.format(doomed=doomed), [user, namespace, *params], why
        )
        ids += gone.ids
        live += gone.live
    return Gone(ids, live)


def _delete_freeing(cursor: Any, doomed: str, params: Sequence[Any], why: dict[str, str]) -> Gone:
    user = params[0]
    cursor.execute(_LOCK_DOOMED.format(doomed=doomed), [user, *params, *params, user, *params])
    _pass_on(cursor, doomed, params, why)
    freeing(cursor, why)
    cursor.execute(_DELETE_LOCKED.format(doomed=doomed), list(params))
    rows = cursor.fetchall()
    freeing(cursor, None)
    return Gone([row[0] for row in rows], sum(1 for row in rows if row[1]))


def _pass_on(cursor: Any, doomed: str, params: Sequence[Any], why: dict[str, str]) -> None:
    """Link each memory a doomed one replaced to the next step of its chain that stays.

    A -> B -> C, B forgotten: A is C's older value, not a current fact again (it was
    made current, beside C, an outdated value every search returned). The next step,
    not the end: A -> B -> C -> D with B forgotten keeps A before C, so D's delete
    later makes C current, not A and C both. Only a chain the delete takes away to its
    end (B the end, or B and C both doomed) frees what it replaced. Runs after the
    lock, before the delete.
    """
    user = params[0]
    cursor.execute(
        _PASSING_ON.format(doomed=doomed), [user, *params, *params, user, *params, *params]
    )
    pass_on(cursor, [(start, end, user) for start, end in cursor.fetchall()], why)


def pass_on(cursor: Any, passing: Sequence[tuple[Any, Any, Any]], why: dict[str, str]) -> None:
    """Link each memory ``start`` to ``step``, the next step of its chain that stays, for
    ``(start, step, user)`` in ``passing``: the memories between them are about to be
    deleted (``why`` says how, and the history of each says the chain goes on). Both are
    locked already. ``step`` may be replaced itself (A -> B -> C -> D, B deleted: A -> C):
    only this link may name a replaced memory (``app.passing_on``, migration 0026)."""
    if not passing:
        return
    reason = (
        "the memory between them expired"
        if why is FREED_BY_EXPIRY
        else "the memory between them was deleted"
    )
    decision = {"decided_by": why["decided_by"], "reason": f"{reason}; the chain goes on"}
    freeing(cursor, decision)
    cursor.execute("SELECT set_config('app.passing_on', 'on', true)")
    cursor.executemany(
        "UPDATE memories SET superseded_by = %s WHERE id = %s AND user_id = %s",
        [(step, start, user) for start, step, user in passing],
    )
    cursor.execute("SELECT set_config('app.passing_on', '', true)")
    # The step's history names what it replaces now, as a link made after a
    # write does (``apply``): its own rows named only the memory deleted.
    replaced: dict[tuple[Any, Any], list[str]] = {}
    for start, step, user in passing:
        replaced.setdefault((step, user), []).append(str(start))
    for (step, user), starts in replaced.items():
        _say_it_replaces(cursor, step, user, starts, decision)


def _say_it_replaces(
    cursor: Any, memory: Any, user_id: Any, replaced: Sequence[Any], decision: Mapping[str, Any]
) -> None:
    """Give ``memory`` an ``updated`` history row, its content unchanged, naming what it
    replaces now (``replaced``; none: no longer what it did) and who decided: a link made
    or undone after the memory was stored (migration 0019's ``app.replaces``)."""
    cursor.execute(
        "SELECT set_config('app.replaces', %s, true), set_config('app.supersession', %s, true)",
        ["{" + ",".join(str(old) for old in replaced) + "}", json.dumps(decision)],
    )
    cursor.execute(
        "UPDATE memories SET version = version + 1 WHERE id = %s AND user_id = %s",
        [memory, str(user_id)],
    )
    cursor.execute(
        "SELECT set_config('app.replaces', '', true), set_config('app.supersession', '', true)"
    )


def announce(links: Sequence[Link]) -> None:
    """Name, for the insert that follows, what it replaces: its ``created`` history row says so."""
    replaced = "{" + ",".join(str(link.old) for link in links) + "}" if links else ""
    why = json.dumps(links[0].decision) if links else ""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('app.replaces', %s, true), set_config('app.supersession', %s, true)",
            [replaced, why],
        )


def _replacer_gone(exc: IntegrityError) -> bool:
    """Whether the link was refused because the replacing memory was replaced meanwhile (the
    supersession trigger, migration 0016) or deleted meanwhile (its foreign key)."""
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None)
    constraint = getattr(getattr(cause, "diag", None), "constraint_name", None)
    if state == "23503":  # the key itself, or the trigger's look finding no memory
        return constraint == "memories_superseded_by_fk" or "not visible here" in str(cause)
    return state == "23514" and "is replaced itself" in str(cause)


def apply(
    user_id: uuid.UUID | str, new: uuid.UUID, links: Sequence[Link], *, stored_before: bool = True
) -> list[str]:
    """Link each older memory to ``new``, in the caller's transaction; return those linked.

    A memory another write replaced first stays with that one (no error).
    Each linked memory's history gets a ``superseded`` row. ``new`` names
    what it replaced on its ``created`` row when this transaction inserted
    it (``announce``; ``stored_before`` False); a memory stored before gets
    an ``updated`` row of its own, its content unchanged (migration 0019).
    """
    done: list[str] = []
    with connection.cursor() as cursor:
        for link in links:
            cursor.execute(
                "SELECT set_config('app.supersession', %s, true)", [json.dumps(link.decision)]
            )
            try:
                cursor.execute(
                    "UPDATE memories SET superseded_by = %s, superseded_at = statement_timestamp()"
                    " WHERE id = %s AND user_id = %s AND superseded_by IS NULL AND id <> %s"
                    " RETURNING id",
                    [new, link.old, str(user_id), new],
                )
            except IntegrityError as exc:
                if stored_before and _replacer_gone(exc):
                    # ``new`` stood before this write (a fact stated again), and a
                    # concurrent one replaced or deleted it since: run the call again.
                    raise LostRace() from exc
                raise
            if cursor.fetchone():
                done.append(str(link.old))
        if done and stored_before:
            first = next(link for link in links if str(link.old) == done[0])
            _say_it_replaces(cursor, new, user_id, done, first.decision)
        cursor.execute(
            "SELECT set_config('app.replaces', '', true), set_config('app.supersession', '', true)"
        )
    return done


def settle_with_model(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    new: uuid.UUID,
    pending: Pending,
) -> list[str]:
    """Ask the configured chat model about the ambiguous candidates; link those it replaces.

    Runs after the write committed, outside any transaction while the model
    thinks (``RECALL_SUPERSESSION_TIMEOUT``); on a timeout, an error or a reply
    out of format, both memories stay current.
    """
    from memories.supersession import llm

    settled = llm.settle(pending.content, pending.candidates, pending.decisions)
    if not settled.model:
        return []
    links = [
        Link(uuid.UUID(d.id), _decision("llm", d, settled.model))
        for d, before in zip(settled.decisions, pending.decisions, strict=True)
        if d.verdict == "supersede" and before.verdict != "supersede"
    ]
    if not links:
        return []
    with tenancy.tenant(user_id, agent_id=agent_id):
        # The new memory and those it would replace, locked in one statement
        # before anything is written, as every writer of two memories takes
        # them; each must still be current.
        held = _lock_current(user_id, [new, *(link.old for link in links)])
        if new not in held:
            return []  # forgotten or replaced meanwhile
        return apply(user_id, new, [link for link in links if link.old in held])


def link(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: object,
    by: object,
) -> dict[str, object]:
    """Link an existing memory ``id`` to the existing memory ``by`` that replaces it.

    What a caller does with a ``may_be_replaced_by`` mark it agrees with
    (the dashboard's "Replaced" button); recorded as ``explicit`` in the
    memory's history, as a named ``replaces`` is. The same checks as
    ``replaces``: both visible to the caller, of one namespace and writer,
    both current; and ``by`` not created before ``id``. Nothing is written otherwise.
    """
    old_id = validation.memory_id(id)
    new_id = validation.memory_id(by, field="by")
    if old_id == new_id:
        raise ValidationFailed("A memory cannot replace itself.")
    with tenancy.tenant(user_id, agent_id=agent_id):
        # Both rows locked, in id order, as every writer of two memories takes them.
        rows = {
            row["id"]: row
            for row in Memory.objects.live()
            .select_for_update(no_key=True)
            .filter(user_id=user_id, id__in=sorted([old_id, new_id]))
            .order_by("id")
            .values(
                "id",
                "namespace",
                "agent_id",
                "superseded_by",
                "source_kind",
                "task_id",
                "created_at",
            )
        }
        old, new = rows.get(old_id), rows.get(new_id)
        if old is None or new is None:
            raise NotFound(f"No memory with id {old_id if old is None else new_id}.")
        if old["namespace"] != new["namespace"] or old["agent_id"] != new["agent_id"]:
            raise ValidationFailed(
                "A memory can be replaced only by one of the same namespace and writer."
            )
        if new["created_at"] < old["created_at"]:
            # Marks point from the older to the newer; a link the other way would
            # hide the later value behind the earlier one.
            raise ValidationFailed(
                f"Memory {new_id} is older than memory {old_id}: only a later memory can"
                " replace an earlier one."
            )
        replaceable(new_id, new, old["task_id"])
        replaceable(old_id, old, new["task_id"])
        for row in (old, new):
            if row["superseded_by"] is not None:
                raise Conflict(f"Memory {row['id']} is already replaced by {row['superseded_by']}.")
        apply(user_id, new_id, [Link(old_id, {"decided_by": "explicit"})])
    return {"id": str(old_id), "superseded_by": str(new_id)}


# From a replaced memory, along superseded_by, to the current memory that
# holds its slot now (a chain is short; the depth bounds a damaged one). An
# end that has expired holds nothing: there is none.
CHAIN_END = """
    WITH RECURSIVE chain(id, next, expires_at, depth) AS (
        SELECT id, superseded_by, expires_at, 0
        FROM memories WHERE id = %(start)s AND user_id = %(user)s
        UNION ALL
        SELECT m.id, m.superseded_by, m.expires_at, c.depth + 1
        FROM memories AS m JOIN chain AS c ON m.id = c.next
        WHERE m.user_id = %(user)s AND c.depth < 64
    )
    SELECT id FROM chain
    WHERE next IS NULL AND id <> %(start)s
      AND (expires_at IS NULL OR expires_at > statement_timestamp())
    LIMIT 1
"""


class ChainMoved(Exception):
    """Another write replaced a chain's end between the walk and the lock: the write
    that restates starts again (``storing.store``) and walks the chain anew."""


def restate(
    user_id: uuid.UUID | str, memory_id: uuid.UUID, also: Sequence[uuid.UUID] = ()
) -> list[Link]:
    """A replaced memory stated again is current again, and replaces its slot's holder.

    Called in the writing transaction, before any other row is locked, when
    a write finds its content already stored (``remember``'s deduplication)
    in a memory a later one replaced: "db1", replaced by "db2", then "db1"
    again. The fact is the first value again, so the memory is made current
    (history: ``restored``, decided_by ``restated``) and the link to make is
    returned: the current end of the chain that replaced it (``db2``, or what
    replaced that since) is to be replaced by it. A link means one slot, so
    no rule is asked again. With detection ``off`` the memory is made
    current and nothing is linked: links are then only the caller's.
    Returns [] when the memory is current by the time it is locked (nothing
    to do); the caller calls it only for a memory it read as replaced.

    The memory and the chain's end are locked in one statement, in id order,
    as ``lock`` does, with ``also`` (a memory the write names in
    ``replaces``): every row the write takes, before it changes any. An end
    another write replaced meanwhile raises ``ChainMoved``: the new end, locked
    in a second statement, would be a row taken after the others, out of id
    order. A memory another write restored meanwhile is left as it is.
    """
    user = str(user_id)
    linking = mode() != "off"
    with connection.cursor() as cursor:
        holder: uuid.UUID | None = None
        end = None
        if linking:
            cursor.execute(CHAIN_END, {"start": memory_id, "user": user})
            end = cursor.fetchone()
        cursor.execute(
            "SELECT id, superseded_by FROM memories WHERE user_id = %s AND id = ANY(%s)"
            " ORDER BY id FOR NO KEY UPDATE",
            [user, [memory_id, *([end[0]] if end else []), *also]],
        )
        held = dict(cursor.fetchall())
        if held.get(memory_id) is None:
            return []  # restored (or forgotten) meanwhile
        if end is not None and end[0] in held:  # else forgotten or expired: no end
            if held[end[0]] is not None:
                raise ChainMoved
            holder = end[0]
        why = {
            "decided_by": "restated",
            "reason": "stated again"
            + (f"; it replaces {holder}, which held its place" if holder else ""),
        }
        cursor.execute("SELECT set_config('app.supersession', %s, true)", [json.dumps(why)])
        cursor.execute(
            "UPDATE memories SET superseded_by = NULL WHERE id = %s AND user_id = %s",
            [memory_id, user],
        )
        cursor.execute("SELECT set_config('app.supersession', '', true)")
    if holder is None:
        return []
    return [
        Link(
            holder, {"decided_by": "restated", "reason": "the memory it replaced was stated again"}
        )
    ]


def _held_with_its_replacement(user_id: uuid.UUID | str, memory_id: uuid.UUID) -> Mapping[str, Any]:
    """Lock a replaced memory and the one that replaced it, in one statement in id order,
    as every writer of two memories takes them; return the replaced one's link.

    A concurrent forget, restore or link of either waits, and then finds what
    this one did. A link another write moved between the read and the lock
    sends the read round again.
    """
    for _ in range(3):
        row = (
            Memory.objects.live()  # an expired memory is gone to every tool
            .filter(user_id=user_id, id=memory_id)
            .values("superseded_by", "superseded_at")
            .first()
        )
        if row is None:
            raise NotFound(f"No memory with id {memory_id}.")
        if row["superseded_by"] is None:
            raise Conflict(f"Memory {memory_id} is not replaced; there is nothing to undo.")
        held = {
            found["id"]: found["superseded_by"]
            for found in Memory.objects.select_for_update(no_key=True)
            .filter(user_id=user_id, id__in=[memory_id, row["superseded_by"]])
            .order_by("id")
            .values("id", "superseded_by")
        }
        if held.get(memory_id, row["superseded_by"]) == row["superseded_by"] and len(held) == 2:
            return row
    raise LostRace()  # the link kept changing while it was undone


def restore(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: object,
) -> dict[str, object]:
    """Undo a supersession: the memory ``id`` is current again; what replaced it stays.

    Recorded in the memory's history as ``restored`` (decided_by ``undo``).
    """
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id, agent_id=agent_id):
        row = _held_with_its_replacement(user_id, memory_id)
        replacer = row["superseded_by"]
        undo = {"decided_by": "undo", "reason": f"undid the replacement by {replacer}"}
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('app.supersession', %s, true)", [json.dumps(undo)])
            cursor.execute(
                "UPDATE memories SET superseded_by = NULL WHERE id = %s AND user_id = %s"
                " RETURNING version",
                [memory_id, str(user_id)],
            )
            (version,) = cursor.fetchone()
            # The replacing memory's history says it too, as it said the link
            # (an updated row, its content unchanged, naming nothing replaced).
            released = {"decided_by": "undo", "reason": f"no longer replaces {memory_id}"}
            _say_it_replaces(cursor, replacer, user_id, [], released)
    return {
        "id": str(memory_id),
        "restored": True,
        "was_superseded_by": str(row["superseded_by"]),
        "was_superseded_at": iso(row["superseded_at"]) if row["superseded_at"] else "",
        "version": version,
    }
