"""The queue of background adds: enqueue, report, take and settle a job.

The queue is the ``memory_jobs`` table. ``enqueue_remember`` writes a job and
wakes the workers (``wake()`` in this process, ``NOTIFY`` on ``CHANNEL`` in
every other); ``run_next_job`` takes one with ``FOR UPDATE SKIP LOCKED`` and
stores it through ``storing.store``, which settles the job in the same
transaction. ``memories/jobs.py`` runs the workers that call it, and their
heartbeat, which calls ``extend_leases``.

A job's writes happen at most once. A lease can still run out under a slow
run (the heartbeat missed, the database away), and another worker then takes
the job while the first is still embedding; each run is named by the
``attempts`` it took the job with, and settles, requeues or fails the job only
while the job is still running under that count. Settling is the last
statement of the transaction that writes the memories, so a run that lost its
job rolls its writes back. A run that hangs (an embedding call that never
returns) keeps its lease only for ``JOB_MAX_RUN_SECONDS``: then the heartbeat
lets the lease run out, and the job is taken again like a dead worker's,
until ``LOST_RUNS`` of its runs have been lost so: a job that kills or hangs
whatever runs it then fails instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import IntegrityError, connection
from django.utils import timezone

from core import context, errors, tenancy
from core.errors import (
    Conflict,
    EmbeddingUnavailable,
    InternalError,
    LostRace,
    NotFound,
    RecallError,
    Unavailable,
    ValidationFailed,
)
from core.logging import describe_exception
from core.timestamps import iso
from memories import validation
from memories.models import (
    Job,
    JobStatus,
    Taken,
)
from memories.services import naming
from memories.services.announced import PENDING
from memories.services.quota import check_quota
from memories.services.shapes import NotReplaced, Queued, QueueDepth, Stored
from memories.services.storing import (
    Item,
    PlacesChanged,
    Remembering,
    places_of,
    store,
    stored_already,
    written_by,
)
from memories.validation import content_hash

logger = logging.getLogger("memories.services")

# Every process's workers LISTEN here (memories/jobs.py): an enqueue NOTIFYs it.
CHANNEL = "recall_jobs"

# A job whose worker died (or hung) is taken over,
# whatever JOB_MAX_ATTEMPTS allows, its worker's loss being no failure of its
# own; but when this many of its runs have been lost so (for an import: since
# it last saved progress) it fails: it kills or hangs whatever runs it.
LOST_RUNS = 3

# What job_status reports of such a job.
_LOST_EVERY_RUN = (
    f"{LOST_RUNS} of the job's runs stopped before they finished (the worker died or "
    "hung), so it will not be run again. To retry, send it again (with a new "
    "idempotency_key, if it had one), or upload the file again for an import."
)

# Set by enqueues in this process, so in-process workers start at once.
waiting = threading.Event()

# The runs of jobs this process has in hand, (job id, attempts), each with
# when it began (time.monotonic()), whose leases the workers' heartbeat
# extends. Two of this process's workers may run one job (the first's lease
# ran out): each is its own run.
_in_hand: dict[tuple[uuid.UUID, int], float] = {}
# Runs that ended on a database outage, to retry once it answers.
_interrupted: set[tuple[uuid.UUID, int]] = set()
_in_hand_lock = threading.Lock()
_OUTAGE = Unavailable(
    "The database became unavailable while this job ran, on its last try; nothing of it"
    " was stored. Send it again."
)


def wake() -> None:
    """Tell this process's workers that a job is waiting."""
    waiting.set()


def enqueue_remember(
    *,
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None = None,
    tier: str,
    call: Remembering,
    idempotency_key: object = None,
) -> Queued:
    """Queue a validated remember call for a worker and return at once.

    The quota is checked now, counting adds already queued, so a caller over
    it hears so at once. The ids are announced now: an item already stored
    (identical content, as ``store`` deduplicates) is announced with its
    memory's id, which the job keeps; a new one with the id the job gives
    it. Only content stored by another call between the two keeps an id
    other than the announced one, which ``job_status`` reports. The same
    ``idempotency_key`` returns the first job, whatever became of it; with
    another request it is a conflict.
    """
    key = validation.idempotency_key(idempotency_key)
    fingerprint = call.fingerprint
    who = context.actor.get()
    job_id = uuid.uuid4()
    with tenancy.tenant(user_id, agent_id=agent_id):
        if key is not None:
            first = _job_by_key(user_id, agent_id, key)
            if first is not None:
                return _replay(first, fingerprint)
        if call.conversation:
            # One enqueue at a time, so that the jobs of a thread are queued (and
            # stamped, clock_timestamp() below) in the order the calls came.
            _take_turn(user_id)
        # Turns go where the thread ends when the job runs: after turns queued
        # before them, which nothing holds yet, so nothing found now holds them.
        found = (
            {}
            if _thread_pending(user_id, agent_id, call)
            else stored_already(user_id, agent_id, call)
        )
        borrowed = _pending_already(user_id, agent_id, call, found)
        adding = len(call.items) - len(found) - len(borrowed)
        # The quota's lock before the row ``replaces`` names, as ``store`` takes
        # them: a direct write of the same pair waits here instead of on us.
        check_quota(user_id, tier, adding=adding, pending=True)
        if call.replaces is not None:
            # Checked now, so a wrong id is refused before anything is queued; the
            # job checks again when it stores the memory. After the key's replay,
            # and with the content's memory: a retry of a call whose link stands
            # is no conflict.
            naming.check_replaces(
                user_id,
                agent_id,
                call.namespace,
                call.replaces,
                call.task_id,
                found=found.get(0),
                free=False,
            )
        ids = [found.get(i) or borrowed.get(i) or uuid.uuid4() for i in range(len(call.items))]
        # The tier travels with the job: the quota was judged by it here.
        payload = {
            **call.as_payload(),
            "ids": [str(i) for i in ids],
            "found": sorted(found),
            "borrowed": sorted(borrowed),
            "tier": tier,
        }
        with connection.cursor() as cursor:
            # One statement: the job, and a wake-up for every process's workers
            # (delivered when the transaction commits).
            cursor.execute(
                "WITH job AS ("
                " INSERT INTO memory_jobs (id, user_id, agent_id, kind, status, idempotency_key,"
                " request_hash, payload, items, attempts, client, api_key_id, error_message,"
                " created_at)"
                " VALUES (%s, %s, %s, 'remember', 'queued', %s, %s, %s::jsonb, %s, 0, %s, %s, '',"
                " clock_timestamp())"
                " ON CONFLICT (user_id, agent_id, idempotency_key)"
                " WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id)"
                " SELECT id, pg_notify(%s, '') FROM job",
                [
                    job_id,
                    str(user_id),
                    str(agent_id) if agent_id else None,
                    key,
                    fingerprint,
                    json.dumps(payload),
                    # What the quota counts while it waits: new memories only.
                    adding,
                    who.client if who else "",
                    who.api_key_id if who else None,
                    CHANNEL,
                ],
            )
            inserted = cursor.fetchone()
        if inserted is None:  # a concurrent retry with the same key got there first
            first = _job_by_key(user_id, agent_id, key or "")
            if first is None:
                raise InternalError("The queued job could not be found. Try again.")
            return _replay(first, fingerprint)
    wake()
    return {
        "job_id": str(job_id),
        "status": JobStatus.QUEUED.value,
        "memory_ids": [str(i) for i in ids],
    }


def _job_by_key(user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, key: str) -> Job | None:
    return Job.objects.filter(written_by(agent_id), user_id=user_id, idempotency_key=key).first()


def _replay(job: Job, fingerprint: str) -> Queued:
    if job.request_hash != fingerprint:
        raise Conflict(
            "This idempotency_key was already used for a different request. "
            "Use a new key for a new request.",
            job_id=str(job.id),
        )
    return {"job_id": str(job.id), "status": job.status, "memory_ids": _announced(job)}


def _announced(job: Job) -> list[str]:
    if job.result:
        return [item["id"] for item in job.result.get("memories", [])]
    return list((job.payload or {}).get("ids", []))


def job_status(
    *, user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None = None, job_id: object
) -> dict[str, object]:
    """Report a background add: queued, running, done (with ids) or failed (with the code)."""
    try:
        wanted = uuid.UUID(job_id) if isinstance(job_id, str) else None
    except ValueError:
        wanted = None
    if wanted is None:
        raise ValidationFailed("job_id must be the job id remember returned (a UUID string).")
    with tenancy.tenant(user_id, agent_id=agent_id):
        job = Job.objects.filter(user_id=user_id, id=wanted).first()
    if job is None:
        raise NotFound(f"No job with id {wanted}.")
    report: dict[str, object] = {
        "job_id": str(job.id),
        "status": job.status,
        "created_at": iso(job.created_at),
        "attempts": job.attempts,
    }
    if job.started_at:
        report["started_at"] = iso(job.started_at)
    if job.finished_at:
        report["finished_at"] = iso(job.finished_at)
    if job.status == JobStatus.DONE and job.result:
        report.update(job.result)
    elif job.status == JobStatus.FAILED:
        report["error"] = {"code": job.error_code, "message": job.error_message}
    else:
        report["memory_ids"] = _announced(job)
    return report


def run_next_job(*, imports: bool = True, stop: threading.Event | None = None) -> bool:
    """Take the next due job, run it, and settle it. Return False when none is due.

    ``imports=False``: a worker kept for adds, which takes no import. ``stop``:
    the workers' stop signal, which a long job asks between its batches
    (``stop_signal()``).

    Taking a job is a statement on the operator path (workers serve every
    tenant): the oldest due add, else the oldest due import (``take_next``),
    or a running one whose worker's lease ran out, locked with SKIP LOCKED so
    concurrent workers each take another.
    The job then runs as its owner (and agent), through ``store``, which settles it in
    the same transaction that writes the memories. A job that fails for a
    reason a retry cannot fix fails at once; one that hits a passing problem
    (the embedder, the database) is retried with back-off, up to
    ``JOB_MAX_ATTEMPTS`` times. While it runs, the job is in hand: the
    workers' heartbeat extends its lease (``extend_leases``) for up to
    ``JOB_MAX_RUN_SECONDS``.
    """
    _running_for.stopping = stop
    with context.acting_as("worker"):
        _hand_back_interrupted()
    with context.acting_as("worker"), tenancy.operator():
        given_up = Job.objects.give_up_lost(LOST_RUNS, InternalError.code, _LOST_EVERY_RUN)
        taken = Job.objects.take_next(settings.JOB_LEASE_SECONDS, LOST_RUNS, imports=imports)
    if given_up:
        logger.warning(
            "gave up jobs whose runs kept losing their worker",
            extra={"jobs": given_up, "lost_runs": LOST_RUNS},
        )
    if taken is None:
        return False
    run = (taken.id, taken.attempts)
    with _in_hand_lock:
        _in_hand[run] = time.monotonic()
    try:
        runner = RUNNERS.get(taken.kind)
        if runner is not None:
            runner(taken)
        else:
            with context.acting_as(taken.client or "worker", taken.api_key_id):
                _run_job(taken)
    except Exception as exc:
        if runner is None and errors.database_away(exc):
            # The database went away mid-run, so nothing of the run was kept
            # (or it settled the job as it committed). Once it answers, the
            # add is retried with back-off, as after an embedder's failure,
            # rather than waiting out its lease as a dead worker's would. An
            # import keeps its lease: its runner saves progress as it goes.
            with _in_hand_lock:
                _interrupted.add(run)
        raise
    finally:
        with _in_hand_lock:
            _in_hand.pop(run, None)  # gone already if the heartbeat gave up on it
    return True


def _hand_back_interrupted() -> None:
    """Retry later, or fail, the jobs whose runs here ended on a database outage.

    An outage is a passing problem, as an embedder's is: the job is queued
    again with back-off and counts the failure, and on its
    ``JOB_MAX_ATTEMPTS``-th it fails as ``unavailable``, so a job that takes
    the database down itself is not run for ever.
    """
    with _in_hand_lock:
        runs = list(_interrupted)
        _interrupted.clear()
    for number, (job_id, attempts) in enumerate(runs):
        try:
            _retry_or_fail(job_id, attempts, _OUTAGE)
        except Exception as exc:
            if errors.database_away(exc):
                with _in_hand_lock:  # still away: these wait for the next poll
                    _interrupted.update(runs[number:])
                raise
            # Not the database: the job's lease still ends, and another run
            # takes it then. The workers go on taking jobs meanwhile.
            logger.error(
                "could not retry a job cut off by a database outage",
                extra={"job_id": str(job_id), **describe_exception(exc)},
            )


def extend_leases() -> int:
    """Extend the lease of every job this process is running; return how many it still has.

    The workers' heartbeat calls it (memories/jobs.py), on the operator path,
    more often than a lease lasts: a live worker keeps its job however slow
    the embedder is, and a dead one stops extending, so its job is taken
    again when the lease runs out. So does a run past ``JOB_MAX_RUN_SECONDS``,
    which is let go once: should it ever finish, its job is no longer its own
    if another run took it, and it writes nothing.
    """
    began_by = time.monotonic() - settings.JOB_MAX_RUN_SECONDS
    with _in_hand_lock:
        overdue = [run for run, began in _in_hand.items() if began < began_by]
        for run in overdue:
            del _in_hand[run]
        runs = list(_in_hand)
    for job_id, attempts in overdue:
        # Ids only: the payload is content.
        logger.warning(
            "job ran past JOB_MAX_RUN_SECONDS; the heartbeat no longer extends its lease",
            extra={
                "job_id": str(job_id),
                "attempt": attempts,
                "max_run_seconds": settings.JOB_MAX_RUN_SECONDS,
            },
        )
    if not runs:
        return 0
    with context.acting_as("worker"), tenancy.operator():
        return Job.objects.extend_leases(runs, settings.JOB_LEASE_SECONDS)


# Jobs of other kinds than a background add, each run by the module that owns
# the work (an upload's import: memories/importers/job.py, registered when the
# app is ready), so that the queue imports none of them.
RUNNERS: dict[str, Callable[[Taken], None]] = {}


def runs(kind: str, runner: Callable[[Taken], None]) -> None:
    """Have workers hand a job of ``kind`` to ``runner`` instead of storing its memories."""
    RUNNERS[kind] = runner


class JobLost(Exception):
    """Another run took the job (this run's lease ran out), or it ended, while this one ran.

    Raised inside the transaction that writes the run's work, so that it rolls back.
    """


# The stop signal of the workers whose thread runs a job: a long job (an
# import) asks it between batches, and hands itself back once it is set rather
# than being cut off when the process exits. None outside the workers.
_running_for = threading.local()


def stop_signal() -> threading.Event | None:
    """The stop signal of the workers running this thread's job (None outside them).

    Read it on the worker's own thread: a job's helper threads do not see it.
    """
    signal: threading.Event | None = getattr(_running_for, "stopping", None)
    return signal


class Stopping(Exception):
    """The process is stopping; raised by a long job between its batches, inside the
    transaction of the batch it was about to count, so that batch rolls back."""


def hand_back(*, job_id: uuid.UUID, attempts: int) -> bool:
    """Queue a job this run holds again, in its place, as if this run never took it.

    For a run stopped with its process: it is no failure, so neither its attempt
    nor a lost run is counted, and it keeps its ``run_after`` (due already, it
    comes before what was queued after it). False when the run no longer held
    the job.
    """
    with tenancy.operator():
        handed = Job.objects.held(job_id, attempts).update(
            status=JobStatus.QUEUED, attempts=attempts - 1, lease_until=None, started_at=None
        )
    return handed == 1


# The ids pending adds of this writer, in this namespace, thread and task,
# announced for the contents they will store (not a conversation's: its
# turns find their places in the thread when the job runs).
# (Labels are never empty: coalesce tells none from any.)
_PENDING_IDS = (
    "SELECT payload->'items', payload->'ids' FROM memory_jobs"
    " WHERE user_id = %s AND coalesce(agent_id::text, '') = %s AND kind = 'remember'"
    " AND status = ANY(%s) AND payload->>'namespace' = %s"
    " AND coalesce(payload->>'thread_id', '') = %s"
    " AND coalesce(payload->>'task_id', '') = %s"
    " AND NOT coalesce((payload->>'conversation')::boolean, false)"
    # Only jobs holding one of the call's contents: a user with many adds
    # queued sends none of the others' payloads.
    " AND EXISTS (SELECT FROM jsonb_array_elements(payload->'items') AS item"
    " WHERE item->>0 = ANY(%s))"
)


def _pending_already(
    user_id: uuid.UUID | str,
    agent_id: uuid.UUID | str | None,
    call: Remembering,
    found: dict[int, uuid.UUID],
) -> dict[int, uuid.UUID]:
    """Return, by item index, the ids pending adds announced for the call's contents that
    are not stored yet: one of them will store it, and this call's job then finds it.

    The same content added twice before the first job ran announced two ids, and the
    second never held a memory. Enqueues of one user's notes take turns (a lock until
    the transaction ends, taken in the same round trip as the look), so the second
    always sees the first.
    """
    if call.conversation:
        return {}
    with connection.cursor() as lock, connection.cursor() as cursor:
        with tenancy.pipeline(lock):
            lock.execute(_TURN, [f"{user_id}/enqueue"])
            cursor.execute(
                _PENDING_IDS,
                [
                    str(user_id),
                    str(agent_id) if agent_id else "",
                    [status.value for status in PENDING],
                    call.namespace,
                    call.thread_id or "",
                    call.task_id or "",
                    [item.content for item in call.items],
                ],
            )
        rows = cursor.fetchall()
    promised: dict[tuple[int | None, str, str], uuid.UUID] = {}
    for items, ids in rows:  # jsonb arrives as text on Django's connections
        for entry, announced in zip(json.loads(items), json.loads(ids), strict=False):
            item = Item(*entry)
            place = (item.position, item.path, content_hash(item.content))
            promised.setdefault(place, uuid.UUID(announced))
    return {
        i: promised[place]
        for i, place in enumerate(places_of(call))
        if i not in found and place in promised
    }


_TURN = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 2))"


def _take_turn(user_id: uuid.UUID | str) -> None:
    """Hold the user's enqueue lock until the transaction ends: one enqueue at a time,
    each seeing the jobs queued before it. Before the quota's lock and any row."""
    with connection.cursor() as cursor:
        cursor.execute(_TURN, [f"{user_id}/enqueue"])


def _thread_pending(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, call: Remembering
) -> bool:
    """Whether a conversation's thread has turns queued and not yet stored."""
    if not call.conversation or call.thread_id is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM memory_jobs WHERE user_id = %s"
            " AND coalesce(agent_id::text, '') = %s AND kind = 'remember' AND status = ANY(%s)"
            " AND payload->>'namespace' = %s AND payload->>'thread_id' = %s"
            " AND coalesce(payload->>'task_id', '') = %s"
            " AND coalesce((payload->>'conversation')::boolean, false))",
            [
                str(user_id),
                str(agent_id) if agent_id else "",
                [status.value for status in PENDING],
                call.namespace,
                call.thread_id,
                call.task_id or "",
            ],
        )
        return bool(cursor.fetchone()[0])


def _free_ids(
    user_id: uuid.UUID | str, agent_id: uuid.UUID | str | None, ids: list[uuid.UUID]
) -> set[uuid.UUID]:
    """Which of ``ids`` no memory and no history holds: a new memory may take them."""
    if not ids:
        return set()
    with tenancy.tenant(user_id, agent_id=agent_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE user_id = %s AND id = ANY(%s) UNION"
            " SELECT memory_id FROM memory_history WHERE user_id = %s AND memory_id = ANY(%s)",
            [str(user_id), ids, str(user_id), ids],
        )
        held = {row[0] for row in cursor.fetchall()}
    return set(ids) - held


def _ids_to_store(job: Taken) -> list[uuid.UUID] | None:
    """The ids a job gives the memories it stores new: those it announced, but never one
    a memory or a history holds.

    An item announced with the id of a memory already stored keeps that memory
    (it is found by its content); forgotten or edited since, it is stored afresh,
    under a new id. So is one whose announced id another add stored first (two
    adds of the same content announce one id): the memory it stored is found by
    its content, and when it was forgotten or edited meanwhile, this one is new.
    """
    ids = [uuid.UUID(i) for i in job.payload.get("ids", [])] or None
    if not ids:
        return ids
    for i in job.payload.get("found", []):
        ids[i] = uuid.uuid4()
    free = _free_ids(job.user_id, job.agent_id, ids)
    return [i if i in free else uuid.uuid4() for i in ids]


def _run_job(job: Taken) -> None:
    def settle(results: list[Stored]) -> None:
        # A hint quotes another memory's content: a job's result, kept after
        # that memory is forgotten, keeps ids only.
        kept = [{k: v for k, v in r.items() if k != "may_replace"} for r in results]
        if not Job.objects.settle(job.id, job.user_id, kept, attempts=job.attempts):
            # Rolls back what this run stored: the job is another run's to write.
            raise JobLost

    try:
        _store_job(job, Remembering.from_payload(job.payload), _ids_to_store(job), settle)
    except JobLost:
        _lost(job.id, job.attempts)
    except (EmbeddingUnavailable, InternalError, PlacesChanged, LostRace) as error:
        _retry_or_fail(job.id, job.attempts, error)
    except RecallError as error:
        _fail(job.id, job.attempts, error)
    except Exception as exc:
        if errors.database_away(exc):
            # The database is away: the worker backs off, and the job is
            # queued again once it answers (run_next_job).
            raise
        if _stored_meanwhile(exc):
            # Another add of the same content, under the id both announced, went
            # first: the next run finds its memory.
            _retry_or_fail(job.id, job.attempts, PlacesChanged("Stored meanwhile by another add."))
            return
        # A run that lost its job may trip over the other run's memories (the
        # same ids): that is no failure of the job's, and is logged as lost.
        shown = errors.from_exception(exc)
        if shown.code != errors.Unavailable.code:  # a cancelled statement keeps its words
            shown = InternalError("Storing this memory failed on our side.")
        if _retry_or_fail(job.id, job.attempts, shown):
            logger.error("job failed", extra={"job_id": str(job.id), **describe_exception(exc)})


def _store_job(
    job: Taken,
    call: Remembering,
    ids: list[uuid.UUID] | None,
    settle: Callable[[list[Stored]], None],
) -> None:
    """Store a job's memories. When the memory its ``replaces`` named was deleted or
    replaced after the call was queued, the note is stored all the same, replacing
    nothing (no detection either), and its result says why under ``not_replaced``: the
    call was accepted, and its fact is not to be lost for want of the link."""

    def run(call: Remembering, finish: Callable[[list[Stored]], None]) -> None:
        store(
            user_id=job.user_id,
            agent_id=job.agent_id,
            tier=job.payload["tier"],
            call=call,
            ids=ids,
            finish=finish,
        )

    try:
        run(call, settle)
        return
    except LostRace:
        raise  # nothing stored: the job runs again
    except (NotFound, Conflict):
        refused = _replaces_refused(job, call)
        if refused is None:
            raise
    note: NotReplaced = {"id": str(call.replaces), "code": refused.code, "message": refused.message}

    def settle_noting(results: list[Stored]) -> None:
        first: Stored = {**results[0], "not_replaced": note}
        settle([first, *results[1:]])

    # Detection stays off: the call asked to replace that memory and no other,
    # and the one that replaced it meanwhile may well be the newer fact.
    run(dataclasses.replace(call, replaces=None, detect=False), settle_noting)


def _replaces_refused(job: Taken, call: Remembering) -> RecallError | None:
    """Why the memory a queued add names in ``replaces`` cannot be replaced now, or None."""
    if call.replaces is None:
        return None
    try:
        with tenancy.tenant(job.user_id, agent_id=job.agent_id):
            naming.check_replaces(
                job.user_id,
                job.agent_id,
                call.namespace,
                call.replaces,
                call.task_id,
                free=False,
            )
    except (NotFound, Conflict) as refused:
        return refused
    return None


def _stored_meanwhile(exc: Exception) -> bool:
    """Whether ``exc`` is a new memory's id taken by another memory at its insert."""
    diag = getattr(exc.__cause__, "diag", None)
    return isinstance(exc, IntegrityError) and (
        getattr(diag, "constraint_name", None) == "memories_pkey"
    )


def retry_in(job_id: uuid.UUID) -> float | None:
    """The back-off before a job whose run failed for a passing reason runs again, or None
    when that failure is its ``JOB_MAX_ATTEMPTS``-th.

    Only runs that failed count (``Job.failures``), not those whose worker died.
    """
    with tenancy.operator():
        failed = Job.objects.failures(job_id) + 1  # this run's failure too
    if failed >= settings.JOB_MAX_ATTEMPTS:
        return None
    return settings.JOB_POLL_SECONDS * 2**failed


def _retry_or_fail(job_id: uuid.UUID, attempts: int, error: RecallError) -> bool:
    """Queue the job again, or fail it when out of attempts; False if this run lost it."""
    delay = retry_in(job_id)
    if delay is None:
        return _fail(job_id, attempts, error)
    with tenancy.operator():
        queued = Job.objects.retry_later(job_id, delay, attempts=attempts)
    if not queued:
        _lost(job_id, attempts)
    return queued


def _fail(job_id: uuid.UUID, attempts: int, error: RecallError) -> bool:
    # The payload goes: a failed job keeps its outcome, never the content.
    with tenancy.operator():
        failed = Job.objects.fail(job_id, error.code, error.message, attempts=attempts)
    if not failed:
        _lost(job_id, attempts)
    return failed


def _lost(job_id: uuid.UUID, attempts: int) -> None:
    # The job's recorded outcome stands, whatever this run met: another run
    # took it (this one's writes rolled back with JobLost), or it had ended
    # already (a run handed back after an outage may have settled it before
    # the database went). Said once, ids only: the payload is content.
    logger.warning(
        "job lost to another run, or ended before this one settled it; its outcome stands",
        extra={"job_id": str(job_id), "attempt": attempts},
    )


def queue_depth(
    user_id: uuid.UUID | str | None = None, agent_id: uuid.UUID | str | None = None
) -> QueueDepth:
    """Return how many jobs wait and how long the oldest has waited: the caller's own
    (its user's, or its agent's), or without ``user_id`` every tenant's (operator path).

    A tenant's health check once read the whole queue: it showed every other
    tenant when they wrote and how much.
    """
    scope = (
        tenancy.tenant(user_id, agent_id=agent_id) if user_id is not None else tenancy.operator()
    )
    with scope:
        waiting = Job.objects.filter(status__in=PENDING)
        if user_id is not None:
            waiting = waiting.filter(user_id=user_id)  # as every tenant statement names it
        depth = waiting.count()
        oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    age = (timezone.now() - oldest).total_seconds() if oldest else 0.0
    return {"depth": depth, "oldest_seconds": round(age, 1)}
