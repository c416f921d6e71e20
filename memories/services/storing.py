"""Storing memories: one validated call's items, written in one transaction, deduplicated.

Every write of new memories ends here: ``remember`` at once, a queued job
later (``queue.py``), seed 003's ``memory_add`` (``sources.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now

from core import context, tenancy
from core.errors import Conflict, QuotaExceeded, ValidationFailed
from core.logging import describe_exception
from memories import embeddings, validation
from memories.embeddings.failures import embed_texts
from memories.indexes import vector_literal
from memories.models import (
    Memory,
    SourceKind,
)
from memories.services import naming, superseding, threads
from memories.services.quota import check_quota
from memories.services.shapes import Hinted, Remembered, Stored

logger = logging.getLogger("memories.services")


@dataclass(frozen=True)
class Item:
    """One memory a call stores: its normalised content, full metadata and source.

    ``position`` is a conversation message's place in its thread (0 first),
    None for anything else. ``kind``, ``author`` and ``path`` say where it
    came from (seed 003): a note, a conversation turn (authored by the
    speaker's name, else their role) or a document's chunk (under its path).
    """

    content: str
    metadata: dict[str, object]
    position: int | None = None
    kind: str = SourceKind.NOTE.value
    author: str = ""
    path: str = ""


@dataclass(frozen=True)
class Remembering:
    """A validated call that stores memories: what to store, and how.

    ``remember`` stores it at once or ``enqueue_remember`` queues it (as
    ``as_payload()``) for a worker to store later; seed 003's ``memory_add``
    builds one too, so every write goes through ``store``.
    """

    items: tuple[Item, ...]
    namespace: str
    priority: str
    expires_at: datetime | None
    thread_id: str | None
    # A hash of the arguments as given, to tell a retry from a different call.
    fingerprint: str
    conversation: bool = False
    # A task shared between the user's agents (seed 003), or None.
    task_id: str | None = None
    # The memory this one replaces (issue 22), named by the caller.
    replaces: uuid.UUID | None = None
    # Whether the write may look for what it replaces. Off for a queued add
    # whose named memory went before it ran: it was to replace that one only.
    detect: bool = True

    @property
    def note(self) -> bool:
        """One note: what supersession compares (turns and chunks record, they do not state)."""
        return (
            not self.conversation
            and len(self.items) == 1
            and self.items[0].kind == SourceKind.NOTE.value
        )

    def as_payload(self) -> dict[str, object]:
        return {
            "items": [
                [item.content, item.metadata, item.position, item.kind, item.author, item.path]
                for item in self.items
            ],
            "namespace": self.namespace,
            "priority": self.priority,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "thread_id": self.thread_id,
            "task_id": self.task_id,
            "fingerprint": self.fingerprint,
            "conversation": self.conversation,
            "replaces": str(self.replaces) if self.replaces else None,
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Remembering:
        expires = payload.get("expires_at")
        return cls(
            items=tuple(Item(*entry) for entry in payload["items"]),
            namespace=payload["namespace"],
            priority=payload["priority"],
            expires_at=datetime.fromisoformat(expires) if expires else None,
            thread_id=payload.get("thread_id"),
            task_id=payload.get("task_id"),
            fingerprint=payload["fingerprint"],
            conversation=bool(payload.get("conversation")),
            replaces=uuid.UUID(payload["replaces"]) if payload.get("replaces") else None,
        )

    def shape(self, stored: list[Stored]) -> Remembered:
        """Return what remember answers: one memory's ``{id, deduped}``, or the thread's."""
        if not self.conversation:
            [one] = stored
            shaped: Remembered = {"id": one["id"], "deduped": one["deduped"]}
            if one.get("replaces"):
                shaped["replaces"] = one["replaces"]
            if one.get("may_replace"):
                shaped["may_replace"] = one["may_replace"]
            return shaped
        return {"thread_id": self.thread_id, "memories": stored, "count": len(stored)}


def fingerprint(given: Mapping[str, object]) -> str:
    canonical = json.dumps(given, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def turn_items(messages: object, metadata: dict[str, object]) -> tuple[Item, ...]:
    """Return a conversation's messages as items: one turn each, in order, in one thread.

    A message's role, position, name and timestamp go into its metadata, on
    top of the call's; its author is its name, else its role.
    """
    return tuple(
        Item(
            text,
            validation.metadata({**metadata, **extra}),
            position,
            kind=SourceKind.CONVERSATION.value,
            author=extra.get("name") or extra["role"],
        )
        for position, (text, extra) in enumerate(validation.messages(messages))
    )


# Where a memory sits for deduplication, within its writer, namespace, thread
# and task (memories_dedup's other columns).
Place = tuple[int | None, str, str]  # position, path, content hash


def store(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    call: Remembering,
    agent_id: uuid.UUID | str | None = None,
    ids: list[uuid.UUID] | None = None,
    finish: Callable[[list[Stored]], None] | None = None,
) -> list[Stored]:
    """Store a validated call's items in one transaction: all of them, or none.

    Returns ``{id, deduped}`` per item, in order. ``ids`` are the ids to give
    new memories (a queued job announced them); ``finish`` runs inside the
    writing transaction with the results, so a job is settled atomically with
    what it stored.

    What is stored already is read before the transaction (what is new must
    be embedded first, outside it), and read again inside it: a memory
    forgotten or replaced in between sends the call round again, so that it
    never answers with a memory that is gone, nor links to one replaced.
    """
    vectors: dict[str, np.ndarray] = {}  # by content, kept across attempts
    attempts = moved = 0
    while attempts < PLACE_ATTEMPTS:
        attempts += 1
        try:
            return _store(user_id, tier, call, agent_id, ids, finish, vectors)
        except _ThreadMoved:
            # Each round, one of the thread's writers goes in: a call waits its turn.
            if moved < THREAD_WRITERS:
                moved += 1
                attempts -= 1
        except _ExpiredInTheWay:
            # Deleted before the writing transaction, as the purge would (and
            # recorded as its work): in it, the copy's row came after the rows
            # the write had taken.
            with context.acting_as("maintenance"), tenancy.tenant(user_id, agent_id=agent_id):
                _drop_expired_at(user_id, agent_id, call)
        except (_PlaceChanged, superseding.ChainMoved):
            pass
    raise PlacesChanged(
        "The memories this call would find were changed by other calls meanwhile;"
        " nothing was written. Make the call again."
    )


# How many times ``store`` reads what is stored already when other calls
# keep changing it between its two reads.
PLACE_ATTEMPTS = 3


class _PlaceChanged(Exception):
    """A memory store() found before its transaction was forgotten or replaced meanwhile,
    or content it did not find was stored by another call meanwhile."""


class _ThreadMoved(_PlaceChanged):
    """Another call added turns to the call's thread between its read and its write."""


# How many other writers of one thread a call makes way for before it gives up.
THREAD_WRITERS = 16


class _ExpiredInTheWay(_PlaceChanged):
    """An expired copy the purge has not reached holds a place the call inserts at."""


class PlacesChanged(Conflict):
    """What store() found kept changing under it: the same call again can succeed."""


def _store(
    user_id: uuid.UUID | str,
    tier: str,
    call: Remembering,
    agent_id: uuid.UUID | str | None,
    ids: list[uuid.UUID] | None,
    finish: Callable[[list[Stored]], None] | None,
    vectors: dict[str, np.ndarray],
) -> list[Stored]:
    sent = call
    with tenancy.tenant(user_id, agent_id=agent_id):
        call = _placed(user_id, agent_id, sent)
        places = places_of(call)
        held = _held_by_place(user_id, agent_id, call, places)
    existing = {place: id for place, (id, _) in held.items()}
    fresh = sorted({i for i, place in enumerate(places) if place not in existing})
    vector_for = _vectors(call, fresh, vectors)

    results: list[Stored] = []
    pending: tuple[uuid.UUID, superseding.Pending] | None = None
    detecting = call.detect and superseding.detects(
        call.note and bool(fresh), call.replaces is not None
    )
    opening = dict(superseding.SETTINGS) if detecting else None
    with tenancy.tenant(user_id, agent_id=agent_id, local_settings=opening):
        _hold_thread(user_id, agent_id, sent, call)
        _still_held(user_id, held)
        # A direct add leaves the places promised to adds already queued; a
        # job's own run is one of those.
        _check_quota(user_id, agent_id, tier, call, [places[i] for i in fresh], finish is None)
        # A replaced note stated again is made current first: its rows are
        # the first this transaction locks (superseding.restate).
        first = held.get(places[0])
        _not_itself(first[0] if first else None, call.replaces)
        named_ids = [call.replaces] if call.replaces is not None else []
        again = (
            superseding.restate(user_id, first[0], named_ids)
            if call.note and first and first[1]
            else []
        )
        links, linked_before = _named_link(user_id, agent_id, call, first[0] if first else None)
        stored: dict[Place, uuid.UUID] = {}
        new_ids = {i: ids[i] if ids else uuid.uuid4() for i in fresh}
        batch = _insert_all(user_id, agent_id, call, places, new_ids, vector_for)
        for i, item in enumerate(call.items):
            place = places[i]
            found = stored.get(place) or existing.get(place)
            if found is None and place in batch:
                stored[place] = found = batch[place]
                results.append(_linked(user_id, found, False, []))
                continue
            if found is None and i in vector_for:
                new_id = new_ids[i]
                waiting = None
                hints: tuple[Hinted, ...] = ()
                if detecting:
                    detected = superseding.detect(
                        user_id,
                        agent_id,
                        call.namespace,
                        item.content,
                        vector_for[i],
                        call.task_id,
                        item.author,
                    )
                    links, waiting, hints = detected.links, detected.pending, detected.hints
                if links:
                    superseding.announce(links)
                found = _insert_new(user_id, agent_id, call, item, place, new_id, vector_for[i])
                stored[place] = found
                if waiting is not None:
                    pending = (found, waiting)
                result = _linked(user_id, found, False, links)
                if hints:
                    result["may_replace"] = list(hints)
                results.append(result)
                continue
            # Stored already: named as a replacement, it becomes one; replaced
            # since, it is current again (above) and replaces what held its place.
            assert found is not None, "every item is stored or found"
            named = links if call.replaces else []
            result = _linked(
                user_id, found, True, named + [x for x in again if x.old != call.replaces]
            )
            if linked_before:  # the same call again: its link stands, and is said
                result["replaces"] = [str(call.replaces), *result.get("replaces", [])]
            results.append(result)
        if finish is not None:
            finish(results)
    if pending is not None:
        [only] = results
        _settle(user_id, agent_id, only, *pending)
    return results


def _named_link(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    found: uuid.UUID | None,
) -> tuple[list[superseding.Link], bool]:
    """The link a named ``replaces`` asks for, checked; and whether it stands already
    (the same call again: ``found`` replaces it), when there is none to write."""
    if call.replaces is None:
        return [], False
    if naming.check_replaces(
        user_id, agent_id, call.namespace, call.replaces, call.task_id, found=found
    ):
        return [], True
    return [superseding.Link(call.replaces, {"decided_by": "explicit"})], False


def _not_itself(found: uuid.UUID | None, replaces: uuid.UUID | None) -> None:
    """Refuse content already stored as the very memory ``replaces`` names.

    It was answered as a plain repeat, nothing linked and nothing said.
    """
    if found is not None and found == replaces:
        raise ValidationFailed(
            f"A memory cannot replace itself: this content is already stored as "
            f"{replaces}. Name the older memory it replaces."
        )


def _settle(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    result: Stored,
    new: uuid.UUID,
    pending: superseding.Pending,
) -> None:
    """After the write commits, let the chat model settle what the rules left open.

    The write stands whatever happens here: a failure to link (the database
    away, a lost race) leaves both memories current, as a model that timed
    out does, and is logged; the caller gets the write's own result.
    """
    try:
        replaced = superseding.settle_with_model(
            user_id=user_id, agent_id=agent_id, new=new, pending=pending
        )
    except Exception as exc:
        logger.warning("linking what the model decided failed", extra=describe_exception(exc))
        return
    if not replaced:
        return
    result["replaces"] = [*result.get("replaces", []), *replaced]
    # What the model linked is no longer a question for the caller.
    left = [hint for hint in result.get("may_replace", []) if hint["id"] not in replaced]
    if left:
        result["may_replace"] = left
    else:
        result.pop("may_replace", None)


def _linked(
    user_id: uuid.UUID | str, found: uuid.UUID, deduped: bool, links: list[superseding.Link]
) -> Stored:
    """Link what ``found`` replaces (in the writing transaction) and say so in its result."""
    result: Stored = {"id": str(found), "deduped": deduped}
    others = [x for x in links if x.old != found]
    replaced = superseding.apply(user_id, found, others, stored_before=deduped) if others else []
    if replaced:
        result["replaces"] = replaced
    return result


def _insert_new(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    item: Item,
    place: Place,
    memory_id: uuid.UUID,
    vector: np.ndarray,
) -> uuid.UUID:
    """Insert one memory and return its id, or start the call again.

    A place held at the insert was free at the first look: another call
    stored the same content since (found now, it is neither locked with what
    this write links nor checked as a restatement), or an expired copy the
    purge has not reached holds it (live() skips it; it goes first).
    """
    row = _insert(user_id, agent_id, call, item, place, memory_id, vector)
    if row is not None:
        return row
    if _ids_by_place(user_id, agent_id, call, [place]).get(place) is None:
        raise _ExpiredInTheWay
    raise _PlaceChanged


def _insert_all(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    places: list[Place],
    new_ids: Mapping[int, uuid.UUID],
    vector_for: Mapping[int, np.ndarray],
) -> dict[Place, uuid.UUID]:
    """Insert a call's new memories in one statement; return those inserted, by place.

    Only for a call of several (a conversation, a document's chunks): each
    statement that writes memories updates the namespace's search statistics
    (migration 0006), in key order within the statement, so a transaction of
    one such statement locks them in one order and cannot deadlock with
    another writer; one statement per item took them again and again and
    could. A place another call holds is left out (ON CONFLICT): the caller
    stores it one by one, as it does a single memory.
    """
    first: dict[Place, int] = {}
    for i in sorted(vector_for):
        first.setdefault(places[i], i)
    if len(first) < 2:
        return {}
    chosen = list(first.values())
    items = [call.items[i] for i in chosen]
    # One array per column that varies (a fixed number of parameters, however
    # long the document), the call's own values once; in the call's order.
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO memories ({_COLUMNS})"  # noqa: S608 - constants
            " SELECT r.id, %s, %s::uuid, %s, r.kind, r.author, r.path, %s, r.position, %s,"
            " r.content, r.hash, r.embedding::vector, %s, r.metadata::jsonb, %s,"
            " %s::timestamptz"
            " FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[],"
            " %s::text[], %s::text[], %s::text[]) WITH ORDINALITY"
            " AS r(id, kind, author, path, position, content, hash, embedding, metadata, n)"
            " ORDER BY r.n"
            " ON CONFLICT ON CONSTRAINT memories_dedup DO NOTHING RETURNING id",
            [
                str(user_id),
                str(agent_id) if agent_id else None,
                call.namespace,
                call.thread_id,
                call.task_id,
                embeddings.get_embedder().model_id,
                call.priority,
                call.expires_at,
                [new_ids[i] for i in chosen],
                [item.kind for item in items],
                [item.author for item in items],
                [item.path for item in items],
                [item.position for item in items],
                [item.content for item in items],
                [places[i][2] for i in chosen],
                [vector_literal(vector_for[i]) for i in chosen],
                [json.dumps(item.metadata) for item in items],
            ],
        )
        inserted = {row[0] for row in cursor.fetchall()}
    return {place: new_ids[i] for place, i in first.items() if new_ids[i] in inserted}


_COLUMNS = (
    "id, user_id, agent_id, namespace, source_kind, author, path, thread_id, position, task_id,"
    " content, content_hash, embedding, embedding_model, metadata, priority, expires_at"
)
_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, %s::jsonb, %s, %s)"


def _values(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    item: Item,
    place: Place,
    memory_id: uuid.UUID,
    vector: np.ndarray,
) -> list[Any]:
    """One memory's values, in ``_COLUMNS`` order."""
    return [
        memory_id,
        str(user_id),
        str(agent_id) if agent_id else None,
        call.namespace,
        item.kind,
        item.author,
        item.path,
        call.thread_id,
        item.position,
        call.task_id,
        item.content,
        place[2],
        vector_literal(vector),
        embeddings.get_embedder().model_id,
        json.dumps(item.metadata),
        call.priority,
        call.expires_at,
    ]


def _insert(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    item: Item,
    place: Place,
    memory_id: uuid.UUID,
    vector: np.ndarray,
) -> uuid.UUID | None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO memories ({_COLUMNS}) VALUES {_ROW}"  # noqa: S608 - constants
            " ON CONFLICT ON CONSTRAINT memories_dedup DO NOTHING RETURNING id",
            _values(user_id, agent_id, call, item, place, memory_id, vector),
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _placed(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, call: Remembering
) -> Remembering:
    """A conversation with its turns at their places in its thread (``threads``); any
    other call as it is. In the caller's tenant transaction."""
    if not call.conversation or not call.items or call.thread_id is None:
        return call
    stored = threads.turns(user_id, agent_id, call.namespace, call.thread_id, call.task_id)
    sent = [validation.content_hash(item.content) for item in call.items]
    offset = threads.first_place(stored, sent)
    if not offset:
        return call

    def moved(item: Item) -> Item:
        position = (item.position or 0) + offset
        return replace(item, position=position, metadata={**item.metadata, "position": position})

    return replace(call, items=tuple(moved(item) for item in call.items))


def _check_quota(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    tier: str,
    call: Remembering,
    fresh: list[Place],
    pending: bool,
) -> None:
    """The quota for the call's new memories. Refused, the call goes round again if
    another call stored some of them meanwhile (the same content added twice at
    once, at the limit): they are no new memories, and count nothing."""
    try:
        check_quota(user_id, tier, adding=len(fresh), pending=pending)
    except QuotaExceeded:
        if fresh and _ids_by_place(user_id, agent_id, call, fresh):
            raise _PlaceChanged from None
        raise


def _hold_thread(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, sent: Remembering, call: Remembering
) -> None:
    """In the writing transaction, hold a conversation's thread, and check that its
    turns go where they were placed before (``call``): else another call's went there."""
    if not sent.conversation or sent.thread_id is None:
        return
    threads.lock(user_id, sent.namespace, sent.thread_id)
    if _placed(user_id, agent_id, sent) != call:
        raise _ThreadMoved


def places_of(call: Remembering) -> list[Place]:
    """Where each of the call's items sits for deduplication."""
    return [
        (item.position, item.path, validation.content_hash(item.content)) for item in call.items
    ]


def stored_already(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, call: Remembering
) -> dict[int, uuid.UUID]:
    """Return, by item index, the live memories already holding the call's items.

    In the caller's tenant transaction; what ``store`` would find and keep.
    """
    call = _placed(user_id, agent_id, call)
    places = places_of(call)
    found = _ids_by_place(user_id, agent_id, call, places)
    return {i: found[place] for i, place in enumerate(places) if place in found}


def _ids_by_place(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    places: list[Place],
) -> dict[Place, uuid.UUID]:
    """Return the live memories already holding these places (memories_dedup's columns)."""
    return {place: id for place, (id, _) in _held_by_place(user_id, agent_id, call, places).items()}


def _vectors(
    call: Remembering, fresh: list[int], known: dict[str, np.ndarray]
) -> dict[int, np.ndarray]:
    """The vectors of the items ``fresh`` by index, embedding only texts ``known`` lacks."""
    texts = (call.items[i].content for i in fresh)
    unread = list(dict.fromkeys(text for text in texts if text not in known))
    if unread:
        embedder = embeddings.get_embedder()
        known.update(zip(unread, embed_texts(embedder, unread), strict=True))
    return {i: known[call.items[i].content] for i in fresh}


def _still_held(user_id: uuid.UUID | str, held: Mapping[Place, tuple[uuid.UUID, bool]]) -> None:
    """Check, in the writing transaction, that what was found is there and as it was.

    A read, not a lock: the rows this write changes are locked later, all in
    one statement in id order (``superseding.restate``, ``lock``), as every
    writer of two memories takes them; a lock here would be a second round
    and could deadlock with a delete. What a call changes after this read
    comes after this write, as if it had begun after it.
    """
    if not held:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, superseded_by IS NOT NULL FROM memories WHERE user_id = %s"
            " AND id = ANY(%s)",
            [str(user_id), [memory_id for memory_id, _ in held.values()]],
        )
        now = dict(cursor.fetchall())
    if now != dict(held.values()):
        raise _PlaceChanged


def _held_by_place(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    places: list[Place],
) -> dict[Place, tuple[uuid.UUID, bool]]:
    """Return the live memories already holding these places, and whether each is replaced.

    A task-shared memory of another agent is visible to an agent, but it is
    not this writer's copy: ``written_by`` leaves it out.
    """
    rows = (
        Memory.objects.live()
        .filter(
            written_by(agent_id),
            user_id=user_id,
            namespace=call.namespace,
            thread_id=call.thread_id,
            task_id=call.task_id,
            content_hash__in={digest for _, _, digest in places},
        )
        .values_list("position", "path", "content_hash", "id", "superseded_by")
    )
    wanted = set(places)
    return {
        (pos, path, digest): (id, by is not None)
        for pos, path, digest, id, by in rows
        if (pos, path, digest) in wanted
    }


def holder(current: Mapping[str, Any], digest: str) -> uuid.UUID | None:
    """Return the live memory holding ``current``'s place with other content, if any."""
    return (
        Memory.objects.live()
        .filter(_placed_like(current, digest))
        .values_list("id", flat=True)
        .first()
    )


def drop_expired_copy(current: Mapping[str, Any], digest: str) -> None:
    """Delete the expired memories holding ``current``'s place with content ``digest``.

    No tool returns them, but until the purge runs one holds its place in the
    dedup index, and an update to its content conflicts with nothing a caller can see.
    """
    _delete_expired(
        current["user_id"],
        Memory.objects.filter(_placed_like(current, digest), expires_at__lte=Now()),
    )


def _placed_like(current: Mapping[str, Any], digest: str) -> Q:
    """The memories at ``current``'s place in the dedup index, with content ``digest``."""
    return written_by(current["agent_id"]) & Q(
        user_id=current["user_id"],
        namespace=current["namespace"],
        thread_id=current["thread_id"],
        position=current["position"],
        task_id=current["task_id"],
        path=current["path"],
        content_hash=digest,
    )


def _drop_expired_at(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, call: Remembering
) -> None:
    """Delete the expired copies of the call's contents where it writes: its writer,
    namespace, thread and task (the places of the dedup index it can meet)."""
    _delete_expired(
        user_id,
        Memory.objects.filter(
            written_by(agent_id),
            user_id=user_id,
            namespace=call.namespace,
            thread_id=call.thread_id,
            task_id=call.task_id,
            content_hash__in=sorted({digest for _, _, digest in places_of(call)}),
            expires_at__lte=Now(),
        ),
    )


def drop_expired_copies(user_id: uuid.UUID | str, digests: Sequence[str]) -> None:
    """Delete the user's expired memories of these contents, wherever they are.

    No tool returns them, yet until the purge runs one holds its place in
    the dedup index, and an insert of the same content there conflicts.
    One statement for a batch of contents (an import's).
    """
    _delete_expired(
        user_id,
        Memory.objects.filter(user_id=user_id, content_hash__in=digests, expires_at__lte=Now()),
    )


def _delete_expired(user_id: uuid.UUID | str, expired: Any) -> None:
    doomed = list(expired.values_list("id", flat=True))
    if not doomed:
        return
    with connection.cursor() as cursor:
        superseding.delete_freeing(
            cursor,
            "SELECT id FROM memories WHERE user_id = %s AND id = ANY(%s) AND expires_at <= now()",
            [str(user_id), doomed],
            naming.FREED_BY_EXPIRY,
            across_namespaces=True,
        )


def written_by(agent_id: uuid.UUID | str | None) -> Q:
    """Match the memories ``agent_id`` wrote itself, or with None the user-wide ones."""
    return Q(agent_id__isnull=True) if agent_id is None else Q(agent_id=agent_id)
