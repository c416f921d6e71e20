"""``remember``: validate a call in full, then store it at once or queue it."""

from __future__ import annotations

import logging
import uuid
from typing import TypedDict, Unpack

from core.errors import (
    ValidationFailed,
)
from memories import validation
from memories.services import naming
from memories.services.queue import enqueue_remember
from memories.services.shapes import Remembered
from memories.services.storing import Item, Remembering, fingerprint, store, turn_items

logger = logging.getLogger("memories.services")


class RememberArguments(TypedDict, total=False):
    """What a remember call stores, as a caller gives it; ``remembering`` validates it."""

    content: object
    messages: object
    namespace: object
    metadata: object
    priority: object
    expires_at: object
    ttl_seconds: object
    thread_id: object
    replaces: object


def remembering(**given: Unpack[RememberArguments]) -> Remembering:
    """Validate a remember call in full, writing nothing.

    Either ``content`` (one memory) or ``messages`` (a conversation: one
    memory per message, in order, all in one thread).
    """
    unknown = sorted(set(given) - set(RememberArguments.__annotations__))
    if unknown:
        # A programming error, not a caller's: the tools pass only these.
        raise TypeError(f"remember() got unexpected keyword arguments: {', '.join(unknown)}")
    content, messages = given.get("content"), given.get("messages")
    namespace, metadata = given.get("namespace", "default"), given.get("metadata")
    priority, thread_id = given.get("priority"), given.get("thread_id")
    expires_at, ttl_seconds = given.get("expires_at"), given.get("ttl_seconds")
    if content is None and messages is None:
        raise ValidationFailed("Pass content (one memory) or messages (a conversation).")
    if content is not None and messages is not None:
        raise ValidationFailed("Pass content (one memory) or messages (a conversation), not both.")
    ns = validation.namespace(namespace)
    level = validation.priority(priority)
    expiry = validation.expiry(expires_at, ttl_seconds)
    thread = validation.label(thread_id, field="thread_id")
    meta = validation.metadata(metadata)
    replaces = naming.parse_replaces(given.get("replaces"))
    if replaces is not None and content is None:
        raise ValidationFailed("replaces applies to one memory (content), not to messages.")
    if content is not None:
        items: tuple[Item, ...] = (Item(validation.content(content), meta),)
    else:
        items = turn_items(messages, meta)
    called = {
        "items": [[item.content, item.metadata] for item in items],
        "namespace": ns,
        "priority": level,
        "expires_at": expires_at,
        "ttl_seconds": ttl_seconds,
        "thread_id": thread,
        "replaces": str(replaces) if replaces else None,
    }
    return Remembering(
        items=items,
        namespace=ns,
        priority=level,
        expires_at=expiry,
        # A conversation always has a thread: the caller's, or a new one.
        thread_id=thread or (uuid.uuid4().hex if messages is not None else None),
        fingerprint=fingerprint(called),
        conversation=messages is not None,
        replaces=replaces,
    )


def remember(
    *,
    user_id: uuid.UUID | str,
    tier: str,
    agent_id: uuid.UUID | str | None = None,
    background: object = False,
    idempotency_key: object = None,
    **arguments: Unpack[RememberArguments],
) -> Remembered:
    """Store a memory (or a conversation), or return the identical one already stored.

    Identical means equal normalised content in the same namespace, written by
    the same agent (or both user-wide), and for a conversation's messages in
    the same thread and position. The unique constraint ``memories_dedup``
    decides it, so concurrent identical calls produce one row; the look-up
    first only saves an embedding. An identical memory that has expired does
    not count: it is replaced.

    With ``background``, the call is validated and queued, and returns at
    once: see ``enqueue_remember``.
    """
    call = remembering(**arguments)
    if validation.flag(background, field="async"):
        # A wrong ``replaces`` is refused before anything is queued (enqueue_remember).
        queued = enqueue_remember(
            user_id=user_id,
            agent_id=agent_id,
            tier=tier,
            call=call,
            idempotency_key=idempotency_key,
        )
        return {
            "job_id": queued["job_id"],
            "status": queued["status"],
            "memory_ids": queued["memory_ids"],
        }
    if idempotency_key is not None:
        raise ValidationFailed(
            "idempotency_key applies to async calls; a synchronous remember is already "
            "idempotent (identical content is stored once)."
        )
    return call.shape(store(user_id=user_id, agent_id=agent_id, tier=tier, call=call))
