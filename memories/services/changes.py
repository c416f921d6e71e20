"""Changing memories: update, forget (by id, by query, a whole namespace) and history.

Forget by query or namespace takes two calls: a preview that stores a
confirmation (``forget_confirmations``) and returns its token, and a
confirmation that deletes exactly what the preview listed.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Unpack

from django.conf import settings
from django.db import IntegrityError, connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from core import tenancy
from core.errors import (
    ConfirmationExpired,
    ConfirmationInvalid,
    Conflict,
    NotFound,
    ValidationFailed,
)
from core.timestamps import iso
from memories import embeddings, search, validation
from memories.embeddings.failures import embed_texts
from memories.models import (
    ForgetConfirmation,
    Memory,
    MemoryHistory,
)
from memories.services import naming, superseding
from memories.services.announced import settle_namespace, waits_for_announced
from memories.services.cursors import cursor as _cursor
from memories.services.cursors import position as _position
from memories.services.importing import clear_imports
from memories.services.shapes import Change, ChangesPage, Deleted, Forgotten, Match, Version
from memories.services.storing import drop_expired_copy, holder

logger = logging.getLogger("memories.services")


@waits_for_announced
def update_memory(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: object,
    content: object = None,
    metadata: object = None,
    priority: object = None,
) -> dict[str, object]:
    """Replace a memory's content (re-embedding it), its metadata and/or its priority.

    Each change that alters any of them is a new version in the memory's history.
    """
    memory_id = validation.memory_id(id)
    if content is None and metadata is None and priority is None:
        raise ValidationFailed("Pass content, metadata or priority to update a memory.")
    text = validation.content(content) if content is not None else None
    meta = validation.metadata(metadata) if metadata is not None else None
    level = validation.priority(priority) if priority is not None else None

    with tenancy.tenant(user_id, agent_id=agent_id):
        current = (
            Memory.objects.live()
            .filter(id=memory_id, user_id=user_id)
            .values(
                "user_id",
                "agent_id",
                "namespace",
                "thread_id",
                "position",
                "task_id",
                "path",
                "content_hash",
            )
            .first()
        )
    if current is None:
        raise NotFound(f"No memory with id {memory_id}.")

    changes: dict[str, Any] = {}
    if meta is not None:
        changes["metadata"] = meta
    if level is not None:
        changes["priority"] = level
    if text is not None:
        digest = validation.content_hash(text)
        if digest != current["content_hash"]:
            embedder = embeddings.get_embedder()
            changes.update(
                content=text,
                content_hash=digest,
                embedding=embed_texts(embedder, [text])[0],
                embedding_model=embedder.model_id,
            )
    if not changes:
        return {"success": True}

    for attempt in (1, 2):
        try:
            with tenancy.tenant(user_id, agent_id=agent_id):
                updated = (
                    Memory.objects.live().filter(id=memory_id, user_id=user_id).update(**changes)
                )
            break
        except IntegrityError:
            with tenancy.tenant(user_id, agent_id=agent_id):
                other = holder(current, changes["content_hash"])
                if other is None and attempt == 1:
                    # An expired copy the purge has not reached holds the
                    # place in the dedup index; it goes, as the purge would,
                    # in a transaction of its own, and the update is tried
                    # again. In the update's transaction, its delete wrote
                    # (the namespace's generation) before the update took
                    # its row, and took the copy's row after the memory's.
                    drop_expired_copy(current, changes["content_hash"])
                    continue
            raise Conflict(
                f"Another memory in namespace '{current['namespace']}' already has this "
                f"content (id {other}). Update or forget that one instead.",
                conflicting_id=str(other),
            ) from None
    if not updated:
        raise NotFound(f"No memory with id {memory_id}.")
    return {"success": True}


def hold_agents_memories(*, user_id: uuid.UUID | str, agent_id: uuid.UUID | str) -> None:
    """Lock an agent's memories, in id order, in the transaction about to delete the agent.

    Its memories go with it through the foreign key's cascade, in the order of
    the cascade's scan; every writer of several memories takes them in id order.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = %s AND agent_id = %s ORDER BY id FOR UPDATE",
            [str(user_id), str(agent_id)],
        )


def hold_users_memories(*, user_ids: Sequence[uuid.UUID | str]) -> None:
    """Lock the users' memories, in id order, in the transaction about to delete the users.

    Django's collector deletes them in the order its scan meets them; every
    writer of several memories takes them in id order.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = ANY(%s::uuid[]) ORDER BY id FOR UPDATE",
            [[str(user_id) for user_id in user_ids]],
        )


def forget(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    mode: str,
    id: object = None,
    confirmation_token: object = None,
    purge: object = False,
    **arguments: Unpack[search.QueryArguments],
) -> Forgotten:
    """Forget, as the ``forget`` tool's modes say: one memory, or two steps for more.

    ``by_id`` deletes the memory ``id`` at once. ``by_query`` and ``all``
    never delete on the first call: it previews (the search ``arguments``
    name what, ``all`` its namespace) and returns a token; the same mode
    with that ``confirmation_token`` deletes exactly what was previewed.
    """
    if mode == "by_id":
        if id is None:
            raise ValidationFailed('mode "by_id" needs the id of the memory to delete.')
        stray = _searching(arguments)
        if confirmation_token is not None:
            stray.append("confirmation_token")
        _refuse_stray("by_id", "id, and optionally namespace and purge", stray)
        return forget_by_id(
            user_id=user_id,
            agent_id=agent_id,
            id=id,
            purge=purge,
            namespace=arguments.get("namespace"),
        )
    if mode == "all":
        stray = _searching(arguments)
        if id is not None:
            stray.append("id")
        _refuse_stray("all", "namespace, and optionally purge and confirmation_token", stray)
    elif id is not None:
        _refuse_stray("by_query", "a query to preview, or a confirmation_token", ["id"])
    if confirmation_token is not None:
        if mode != "all":
            # A confirmation deletes what its preview listed: a search argument
            # beside it could narrow nothing, and was dropped without a word.
            _refuse_confirming(_searching(arguments))
        return forget_confirm(
            user_id=user_id,
            agent_id=agent_id,
            confirmation_token=confirmation_token,
            purge=purge,
            mode=mode,
            namespace=arguments.get("namespace"),
        )
    if mode == "all":
        return forget_all_preview(
            user_id=user_id, agent_id=agent_id, namespace=arguments.get("namespace"), purge=purge
        )
    if arguments.get("query") is None:
        raise ValidationFailed(
            'mode "by_query" needs a query (to preview) or a confirmation_token (to delete).'
        )
    return forget_preview(user_id=user_id, agent_id=agent_id, purge=purge, **arguments)


def _searching(arguments: search.QueryArguments) -> list[str]:
    """The search arguments given, which only mode "by_query" reads (the tool's defaults aside)."""
    stray = [name for name in _SEARCH_ONLY if arguments.get(name) is not None]
    if arguments.get("limit") not in (None, 10):  # the tool's default
        stray.append("limit")
    if arguments.get("include_superseded"):
        stray.append("include_superseded")
    return stray


def _refuse_confirming(stray: list[str]) -> None:
    if stray:
        verb = "belongs" if len(stray) == 1 else "belong"
        raise ValidationFailed(
            "A confirmation deletes exactly what its preview listed, and takes only the"
            f" confirmation_token, purge and the preview's namespace; {' and '.join(stray)}"
            f" {verb} to the preview."
        )


def _refuse_stray(mode: str, takes: str, stray: list[str]) -> None:
    """Refuse arguments a mode would not read: never dropped without a word."""
    if stray:
        verb = "belongs" if len(stray) == 1 else "belong"
        raise ValidationFailed(
            f'mode "{mode}" takes {takes}; {" and ".join(stray)} {verb} to the other modes.'
        )


@waits_for_announced
def forget_by_id(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    id: object,
    purge: object = False,
    namespace: object = None,
) -> Forgotten:
    """Delete one memory. Its history stays for HISTORY_RETENTION_DAYS, unless ``purge``.

    With ``namespace``, only if it is there: a memory elsewhere is not found.
    """
    memory_id = validation.memory_id(id)
    wipe = validation.flag(purge, field="purge")
    where = None if namespace is None else validation.namespace(namespace)
    with tenancy.tenant(user_id, agent_id=agent_id):
        # An expired memory is no tool's to delete: not found, as for every
        # other tool. The purge removes it; its history stays its retention.
        if where is None:
            deleted = _delete(BY_LIVE_IDS, [str(user_id), [memory_id]], wipe)
        else:
            deleted = _delete(
                BY_LIVE_IDS + " AND namespace = %s", [str(user_id), [memory_id], where], wipe
            )
    if not deleted:
        raise NotFound(
            f"No memory with id {memory_id}" + (f" in namespace {where}." if where else ".")
        )
    return {"success": True, "purged": True} if wipe else {"success": True}


def forget_preview(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    purge: object = False,
    **arguments: Unpack[search.QueryArguments],
) -> Forgotten:
    """Find what a query would delete and return a token that deletes exactly that.

    The matches are what recall would return for the same arguments, in the
    server's search mode. Nothing is deleted here. With no matches there is
    nothing to confirm, so no token is issued. ``purge`` makes the
    confirmation remove the deleted memories' history too.
    """
    args = search.SearchArgs.parse(**arguments)
    wipe = validation.flag(purge, field="purge")
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.FORGET_TOKEN_TTL_SECONDS)

    def confirm(found: list[search.Found]) -> None:
        _confirmation(
            token,
            expires_at,
            found=bool(found),
            user_id=user_id,
            agent_id=agent_id,
            memory_ids=[hit.memory.id for hit in found],
            purge=wipe,
        )

    found = search.search(user_id=user_id, agent_id=agent_id, args=args, within=confirm).found
    matches = [_match(hit) for hit in found]
    return {
        "preview": True,
        "matches": matches,
        "total_matches": len(matches),
        "confirmation_token": token if found else None,
        "expires_at": iso(expires_at) if found else None,
    }


def forget_all_preview(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: object,
    purge: object = False,
) -> Forgotten:
    """Count a namespace's memories and return a token that deletes them, and only them.

    The namespace must be named: there is no default for deleting everything.
    Confirming deletes the memories the namespace held at this preview;
    memories stored after it are kept.
    """
    if namespace is None:
        raise ValidationFailed('mode "all" needs the namespace to empty; it has no default.')
    ns = validation.namespace(namespace)
    wipe = validation.flag(purge, field="purge")
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.FORGET_TOKEN_TTL_SECONDS)
    with tenancy.tenant(user_id, agent_id=agent_id):
        cutoff = _now()
        total = Memory.objects.live().filter(user_id=user_id, namespace=ns).count()
        _confirmation(
            token,
            expires_at,
            found=bool(total),
            user_id=user_id,
            agent_id=agent_id,
            memory_ids=[],
            namespace=ns,
            cutoff=cutoff,
            purge=wipe,
        )
    return {
        "preview": True,
        "namespace": ns,
        "total_matches": total,
        "confirmation_token": token if total else None,
        "expires_at": iso(expires_at) if total else None,
    }


def _confirmation(
    token: str,
    expires_at: datetime,
    *,
    found: bool,
    user_id: uuid.UUID | str,
    **fields: object,
) -> None:
    """Store what a preview found under its token's hash, in the caller's tenant transaction.

    The user's long-expired confirmations go first (``EXPIRED_KEPT``), found
    or not; with nothing found there is nothing to confirm and no row.
    """
    ForgetConfirmation.objects.filter(
        user_id=user_id, expires_at__lt=timezone.now() - EXPIRED_KEPT
    ).delete()
    if found:
        ForgetConfirmation.objects.create(
            token_hash=_token_hash(token), user_id=user_id, expires_at=expires_at, **fields
        )


# An expired confirmation stays this long, so that confirming it answers
# confirmation_expired rather than "unknown or used"; then it is cleared (by
# the next preview of its user, or by maintenance).
EXPIRED_KEPT = timedelta(days=1)


def _of_all(mode: str | None) -> bool | None:
    """Whether a confirmation must come from a preview of mode "all" (None: either)."""
    return None if mode is None else mode == "all"


def forget_confirm(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    confirmation_token: object,
    purge: object = False,
    mode: str | None = None,
    namespace: object = None,
) -> Forgotten:
    """Delete exactly what a preview listed. The token works once, for 5 minutes.

    ``namespace``, when given with a token of mode "all", must be the one the
    preview counted: a token for another is refused, and stays usable.

    A token that is unknown, already used, another user's or another
    agent's is the same ``confirmation_invalid``: row-level security hides
    other users' tokens, and a token is confirmed where it was previewed.
    With ``mode`` (the ``forget`` tool's), the token must come from a preview
    of that mode ("all" or "by_query"); one of the other mode is refused the
    same way and stays usable with its own. History is purged if the preview
    or this call asks for it.
    """
    if not isinstance(confirmation_token, str) or not 0 < len(confirmation_token) <= 256:
        raise ValidationFailed("confirmation_token must be the token a preview returned.")
    wipe = validation.flag(purge, field="purge")
    if namespace is not None:
        namespace = validation.namespace(namespace)
    with tenancy.tenant(user_id, agent_id=agent_id):
        # Deleting the confirmation first claims it: of two concurrent
        # confirmations, the second finds nothing.
        with connection.cursor() as cursor:
            # The user as well as the policy: a distributed database routes
            # on the statement's own user_id (docs/scale-out.md).
            # A preview of mode "all" names its namespace; one of "by_query", ids.
            # The agent as well: the user-wide path sees its agents' tokens, and
            # confirming one of mode "all" there emptied the namespace of every
            # writer, where the agent's preview counted its own memories only.
            cursor.execute(
                "DELETE FROM forget_confirmations WHERE token_hash = %s AND user_id = %s"
                " AND coalesce(agent_id::text, '') = %s"
                " AND (%s::boolean IS NULL OR (namespace IS NOT NULL) = %s::boolean)"
                " RETURNING memory_ids, namespace, cutoff, purge,"
                " expires_at <= statement_timestamp()",
                [
                    _token_hash(confirmation_token),
                    str(user_id),
                    "" if agent_id is None else str(agent_id),
                    *[_of_all(mode)] * 2,
                ],
            )
            claimed = cursor.fetchone()
        if claimed is None:
            raise ConfirmationInvalid(
                "This confirmation token is not valid"
                + (f' for mode "{mode}"' if mode else "")
                + ": it may have been used already"
                + (", or it came from a preview of the other mode" if mode else "")
                + ". Run the forget preview again to get a new one."
            )
        memory_ids, previewed, cutoff, preview_purge, expired = claimed
        if namespace is not None and previewed is None:
            _check_previewed_namespace(user_id, memory_ids, namespace)
        if namespace is not None and previewed is not None and namespace != previewed:
            # Raised in the transaction that claimed the token: the claim rolls back.
            raise ValidationFailed(
                f"This confirmation token empties namespace {previewed}, not {namespace}."
            )
        deleted = 0
        if not expired:
            if previewed is not None:
                deleted = _delete_namespace(user_id, previewed, cutoff, wipe or preview_purge)
            else:
                deleted = _delete_ids(user_id, memory_ids, wipe or preview_purge)
    if expired:
        raise ConfirmationExpired(
            "This confirmation token has expired. Run the preview again to get a new one."
        )
    done: Forgotten = {"success": True, "deleted_count": deleted}
    if wipe or preview_purge:
        done["purged"] = True
    return done


def _check_previewed_namespace(
    user_id: uuid.UUID | str, memory_ids: list[uuid.UUID], namespace: str
) -> None:
    """Refuse a by_query confirmation that names another namespace than its preview searched.

    Raised in the transaction that claimed the token: the claim rolls back.
    """
    elsewhere = (
        Memory.objects.filter(user_id=user_id, id__in=memory_ids)
        .exclude(namespace=namespace)
        .values_list("namespace", flat=True)
        .first()
    )
    if elsewhere is not None:
        raise ValidationFailed(
            f"This confirmation token deletes memories of namespace {elsewhere}, not {namespace}."
        )


def forget_namespace(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    namespace: object = "default",
    purge: object = False,
) -> Deleted:
    """Delete every memory in one namespace of one user, in one call.

    Only seed 001's ``delete_all_memories`` uses this, because that tool's
    contract is one call; ``forget(mode="all")`` previews and confirms.
    """
    ns = validation.namespace(namespace)
    wipe = validation.flag(purge, field="purge")
    settle_namespace(user_id, agent_id, ns)  # adds queued before this call go with it
    with tenancy.tenant(user_id):
        # And uploaded imports, which are the user's, not an agent's: first,
        # so that a batch storing now is waited for and then deleted.
        clear_imports(user_id=user_id, agent_id=agent_id, namespace=ns)
    try:
        with tenancy.tenant(user_id, agent_id=agent_id):
            deleted = _delete_namespace(user_id, ns, None, wipe)
    except Exception:
        # Nothing was deleted: the imports go on storing there, as before
        # the call (a batch that read the mark meanwhile left its part out).
        with tenancy.tenant(user_id):
            clear_imports(user_id=user_id, agent_id=agent_id, namespace=ns, undo=True)
        raise
    return {"deleted_count": deleted, "namespace": ns, "purged": wipe}


# What a delete selects, by the user and a condition of its own; the lock
# and the delete are ``superseding.delete_freeing``'s.
_DOOMED = "SELECT id FROM memories WHERE user_id = %s AND {}"
BY_IDS = "id = ANY(%s)"
BY_LIVE_IDS = "id = ANY(%s) AND (expires_at IS NULL OR expires_at > statement_timestamp())"
# The search arguments of forget's by_query mode, which by_id has no use for.
_SEARCH_ONLY = ("query", "metadata_filter", "created_after", "created_before", "threshold")
IN_NAMESPACE = "namespace = %s"
IN_NAMESPACE_UNTIL = "namespace = %s AND created_at <= %s"


def _delete_ids(user_id: uuid.UUID | str, memory_ids: list[uuid.UUID], purge: bool) -> int:
    return _delete(BY_IDS, [str(user_id), list(memory_ids)], purge)


def delete_as_operator(memory_ids: list[uuid.UUID]) -> int:
    """Delete these memories, whoever's, as a tool's delete does (operator path: the
    admin). Each user's through ``delete_freeing``, a namespace at a time: rows locked
    by id first, and what a memory between two of a chain replaced passes on along it.
    A plain delete freed it beside the chain's later memory, with no reason given."""
    owners: dict[str, list[uuid.UUID]] = {}
    for memory, owner in Memory.objects.filter(id__in=memory_ids).values_list("id", "user_id"):
        owners.setdefault(str(owner), []).append(memory)
    deleted = 0
    for user_id in sorted(owners):
        with connection.cursor() as cursor:
            gone = superseding.delete_freeing(
                cursor,
                _DOOMED.format(BY_IDS),
                [user_id, owners[user_id]],
                naming.FREED,
                across_namespaces=True,
            )
        deleted += len(gone.ids)
    return deleted


def _delete_namespace(
    user_id: uuid.UUID | str, namespace: str, cutoff: datetime | None, purge: bool
) -> int:
    """Delete one user's memories in one namespace (created up to ``cutoff``)."""
    if cutoff is None:
        return _delete(IN_NAMESPACE, [str(user_id), namespace], purge)
    return _delete(IN_NAMESPACE_UNTIL, [str(user_id), namespace, cutoff], purge)


def _delete(condition: str, params: list[Any], purge: bool) -> int:
    """Delete the memories ``condition`` selects (``params``: the user, then its own).

    Return how many of them had not expired: an expired memory goes with the
    rest (the purge would take it anyway) but no tool answers for it, so it
    is not counted as deleted.
    """
    with connection.cursor() as cursor:
        gone = superseding.delete_freeing(cursor, _DOOMED.format(condition), params, naming.FREED)
    if purge and gone.ids:
        _purge_history(gone.ids)
    return gone.live


def _purge_history(memory_ids: list[uuid.UUID]) -> int:
    """Remove the history of memories deleted in this transaction (tenant path)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT recall_purge_history(%s::uuid[])", [list(memory_ids)])
        (purged,) = cursor.fetchone()
    return int(purged)


def _now() -> datetime:
    """Return the transaction's own clock, the one created_at and expiry use."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (moment,) = cursor.fetchone()
    return moment


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# The columns of a history row that ``_version`` shows.
_VERSION = (
    "version",
    "action",
    "namespace",
    "content",
    "metadata",
    "priority",
    "expires_at",
    "client",
    "api_key_id",
    "recorded_at",
)


@waits_for_announced
def memory_history(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, id: object
) -> list[Version]:
    """Return every recorded version of a memory, oldest first.

    A deleted memory's history stays readable until the retention purge (or
    ``forget(purge=true)``) removes it; its last version is the deletion. An
    agent reads only its own memories' history, as it reads only its own
    memories (row-level security).
    """
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id, agent_id=agent_id):
        rows = list(
            MemoryHistory.objects.filter(user_id=user_id, memory_id=memory_id)
            .order_by("version")
            .values(*_VERSION, "superseded_by", "replaces", "decision")
        )
    if not rows:
        raise NotFound(f"No memory with id {memory_id}, and no history of one.")
    return [_version(row) for row in rows]


def _version(row: Mapping[str, Any]) -> Version:
    return {
        "version": row["version"],
        "action": row["action"],
        "content": row["content"],
        "metadata": row["metadata"],
        "namespace": row["namespace"],
        "priority": row["priority"],
        "expires_at": iso(row["expires_at"]) if row["expires_at"] else None,
        "timestamp": iso(row["recorded_at"]),
        "client": row["client"],
        "api_key_id": str(row["api_key_id"]) if row["api_key_id"] else None,
        "superseded_by": str(row["superseded_by"]) if row.get("superseded_by") else None,
        "replaces": [str(x) for x in row["replaces"]] if row.get("replaces") else None,
        "decision": row.get("decision"),
    }


def erase_history(*, user_id: uuid.UUID | str, id: object) -> int:
    """Erase a deleted memory's history now, rather than at the end of its retention.

    A live memory's history cannot be erased (delete it with purge instead).
    """
    memory_id = validation.memory_id(id)
    with tenancy.tenant(user_id):
        if Memory.objects.filter(id=memory_id, user_id=user_id).exists():
            raise Conflict(
                "This memory still exists; forget it with purge to erase it and its history."
            )
        erased = _purge_history([memory_id])
    if not erased:
        raise NotFound(f"No history of a memory with id {memory_id}.")
    return erased


def recent_changes(
    *,
    user_id: uuid.UUID | str,
    limit: int = 50,
    before: str | None = None,
    after: str | None = None,
) -> ChangesPage:
    """Return a page of the user's changes to any memory, newest first (the dashboard's feed).

    Paged by position, not by count: ``before`` (the page's ``older``) gives
    the changes just older than one change, ``after`` (``newer``) those just
    newer, so a change recorded meanwhile shifts no page, and a page far back
    reads the index from the cursor on, not every newer change. Neither, or
    fewer than a page newer than ``after``: the latest changes. A cursor
    that is not one of ours is refused (``ValidationFailed``).
    """
    older_than = _position(user_id, before) if before else None
    newer_than = _position(user_id, after) if after else None
    with tenancy.tenant(user_id):
        mine = MemoryHistory.objects.filter(user_id=user_id).values("id", *_FEED)
        if newer_than is not None:
            rows = list(_newer(mine, newer_than).order_by("recorded_at", "id")[: limit + 1])
            if len(rows) < limit:  # no page's worth newer than the cursor: the latest page
                return recent_changes(user_id=user_id, limit=limit)
            newer = _cursor(user_id, rows[limit - 1]) if len(rows) > limit else None
            rows = rows[:limit][::-1]
            older = _cursor(user_id, rows[-1]) if _older(mine, _key(rows[-1])).exists() else None
        else:
            query = mine if older_than is None else _older(mine, older_than)
            rows = list(query.order_by("-recorded_at", "-id")[: limit + 1])
            older = _cursor(user_id, rows[limit - 1]) if len(rows) > limit else None
            rows = rows[:limit]
            # None past the oldest change (a link older than the retention
            # kept): the page says so and leads back to the latest.
            newer = (
                _cursor(user_id, rows[0]) if rows and _newer(mine, _key(rows[0])).exists() else None
            )
    return {"changes": [_change(row) for row in rows], "newer": newer, "older": older}


def _change(row: Mapping[str, Any]) -> Change:
    return {"memory_id": str(row["memory_id"]), **_version(row)}


Feed = QuerySet[MemoryHistory, dict[str, Any]]
# What the feed shows of each change.
_FEED = ("memory_id", *_VERSION)


def _key(row: Mapping[str, Any]) -> tuple[datetime, int]:
    return row["recorded_at"], row["id"]


def _older(rows: Feed, key: tuple[datetime, int]) -> Feed:
    moment, row_id = key
    # The plain bound lets the index on (user, recorded_at) start at the
    # cursor; the OR alone, it read every newer row and dropped it.
    return rows.filter(recorded_at__lte=moment).filter(
        Q(recorded_at__lt=moment) | Q(recorded_at=moment, id__lt=row_id)
    )


def _newer(rows: Feed, key: tuple[datetime, int]) -> Feed:
    moment, row_id = key
    return rows.filter(recorded_at__gte=moment).filter(
        Q(recorded_at__gt=moment) | Q(recorded_at=moment, id__gt=row_id)
    )


def _match(hit: search.Found) -> Match:
    match: Match = {
        "id": str(hit.memory.id),
        "content": hit.memory.content,
        "similarity": hit.similarity,
        "score": hit.score,
    }
    memory = hit.memory
    if memory.superseded_by is not None and memory.superseded_at is not None:
        # Only with include_superseded: marked as replaced, as recall marks it.
        match["superseded_by"] = str(memory.superseded_by)
        match["superseded_at"] = iso(memory.superseded_at)
    if hit.may_be_replaced_by is not None:
        match["may_be_replaced_by"] = hit.may_be_replaced_by
    return match
