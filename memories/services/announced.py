"""Calls that name what a background add announced and has not stored yet wait for it.

``remember`` with ``async`` (seed 001's ``add_memory`` by default) answers
with the new memories' ids at once, before a worker stores them. A call that
names such an id straight away (an update, a delete, its history) and a delete
of the namespace the add goes to wait a few seconds for the add to settle.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from core import errors, tenancy
from core.errors import NotFound, ValidationFailed
from memories import validation
from memories.models import Job, JobStatus

P = ParamSpec("P")
T = TypeVar("T")

PENDING = (JobStatus.QUEUED, JobStatus.RUNNING)


# How long a call that names a memory a background add announced waits for
# the add to store it, before saying it is still on its way.
ANNOUNCED_WAIT_SECONDS = 5.0


def waits_for_announced(call: Callable[P, T]) -> Callable[P, T]:
    """Have ``call`` (keyword arguments ``user_id``, ``agent_id``, ``id``) wait for a memory
    a background add announced and has not stored yet.

    ``remember`` with ``async`` (seed 001's ``add_memory`` by default) returns
    the new memory's id at once; a call that names it straight away found no
    memory and answered not_found, so a client that added and then deleted
    kept the memory. Now the call waits up to ``ANNOUNCED_WAIT_SECONDS`` for
    the job and runs again; a job still pending then is named in the refusal.
    """

    @functools.wraps(call)
    def waiting(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return call(*args, **kwargs)
        except NotFound:
            user = str(kwargs["user_id"])
            agent = None if kwargs.get("agent_id") is None else str(kwargs["agent_id"])
            announced = _announcing(user, agent, kwargs.get("id"))
            if announced is None:
                raise
            job, due = announced
            status = _settled(user, agent, job) if due else JobStatus.QUEUED.value
            if status in PENDING:
                raise NotFound(
                    f"No memory with id {kwargs.get('id')} yet: the background add that"
                    f" announced it (job {job}) is still {status}. Try again shortly, or"
                    " check it with job_status."
                ) from None
        return call(*args, **kwargs)

    return waiting


def _announcing(user_id: str, agent_id: str | None, given: object) -> tuple[uuid.UUID, bool] | None:
    """The caller's pending background add that will store the memory ``given`` names, and
    whether it may within ``ANNOUNCED_WAIT_SECONDS`` (running, or due by then); None if
    none will.

    Only an id it announced for a new memory counts: one it found stored
    already (``found``) is that memory's, and a forgotten one is stored under
    another id.
    """
    try:
        wanted = str(validation.memory_id(given))
    except ValidationFailed:
        return None
    due_by = timezone.now() + timedelta(seconds=ANNOUNCED_WAIT_SECONDS)
    with tenancy.tenant(user_id, agent_id=agent_id):
        candidates = list(
            Job.objects.filter(
                user_id=user_id,
                status__in=PENDING,
                kind="remember",
                payload__ids__contains=[wanted],
            ).values_list("id", "status", "run_after", "payload__ids", "payload__found")
        )
    for job, status, run_after, ids, found in candidates:
        if isinstance(ids, list) and wanted in ids and ids.index(wanted) not in (found or []):
            due = status == JobStatus.RUNNING or run_after <= due_by
            return uuid.UUID(str(job)), due
    return None


def _settled(user_id: str, agent_id: str | None, job: uuid.UUID) -> str:
    """Wait up to ``ANNOUNCED_WAIT_SECONDS`` for ``job`` to end; return its status then."""
    status = ""

    def ended() -> bool:
        nonlocal status
        with tenancy.tenant(user_id, agent_id=agent_id):
            status = str(Job.objects.filter(id=job).values_list("status", flat=True).first())
        return status not in PENDING

    _poll(ended)
    return status


def _poll(done: Callable[[], bool]) -> bool:
    """Ask ``done`` every quarter second until it says yes or ``ANNOUNCED_WAIT_SECONDS``
    have passed; return its last answer."""
    deadline = time.monotonic() + ANNOUNCED_WAIT_SECONDS
    while not (answer := done()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return answer


def settle_namespace(user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, ns: str) -> int:
    """Before a one-call delete of ``ns``: let the caller's background adds into it settle.

    An add queued before the delete is one the delete is meant to take, but
    its memories were not stored yet, so they outlived it (seed 001's
    ``add_memory`` queues by default: add, then ``delete_all_memories``, kept
    everything). Wait up to ``ANNOUNCED_WAIT_SECONDS`` for those jobs; one
    still queued or running then is withdrawn (failed, ``conflict``), so its
    memories are never stored: a run settles its job in the transaction that
    stores, only while the job is still its own (``queue._run_job``), so a
    run that is storing now rolls back. A run that settled first committed
    before this returns, and the delete takes what it stored. Return how many
    were withdrawn.
    """
    user = str(user_id)
    agent = None if agent_id is None else str(agent_id)
    with tenancy.tenant(user, agent_id=agent), connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")  # the clock created_at was set by
        (cutoff,) = cursor.fetchone()
    pending = Job.objects.filter(
        user_id=user, kind="remember", status__in=PENDING, created_at__lte=cutoff
    ).filter(payload__namespace=ns)

    def settled() -> bool:
        with tenancy.tenant(user, agent_id=agent):
            return not pending.exists()

    if _poll(settled):
        return 0
    message = (
        f"Withdrawn: delete_all_memories emptied namespace {ns} "
        "after this add was queued, so its memories were not stored."
    )
    with tenancy.tenant(user, agent_id=agent):
        # The tenant's own path, naming the user as every tool's statement does.
        return pending.update(
            status=JobStatus.FAILED,
            payload=None,
            error_code=errors.Conflict.code,
            error_message=message[:500],
            finished_at=Now(),
            lease_until=None,
        )
