from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import connection, models, transaction
from django.db.models.functions import Now
from pgvector.django import VectorField


class SourceKind(models.TextChoices):
    CONVERSATION = "conversation", "Conversation"
    DOCUMENT = "document", "Document"
    NOTE = "note", "Note"


class Priority(models.TextChoices):
    CRITICAL = "critical", "Critical"
    HIGH = "high", "High"
    MEDIUM = "medium", "Medium"
    LOW = "low", "Low"


# Highest first: the order priority breaks ties in (memories/search.py).
PRIORITY_RANK = {Priority.CRITICAL: 3, Priority.HIGH: 2, Priority.MEDIUM: 1, Priority.LOW: 0}


class MemoryQuerySet(models.QuerySet["Memory"]):
    def live(self) -> MemoryQuerySet:
        """Exclude expired memories, which no tool returns even before they are purged."""
        return self.filter(models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=Now()))


class Memory(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories", db_index=False
    )
    # NULL for memories written with a user-wide API key: they belong to the
    # user. Otherwise the agent that wrote it, which alone may see it (plus
    # task sharing); row-level security enforces that, see core/tenancy.py.
    # A composite foreign key (agent_id, user_id), ON DELETE CASCADE, keeps
    # agents to their own user (migration 0004); Django must not emulate it.
    agent = models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="memories",
        db_index=False,
    )
    namespace = models.CharField(max_length=64, default="default")
    # Where the memory came from (seed 003): a conversation turn, a document
    # chunk or a note; who said or wrote it; the document's path.
    source_kind = models.CharField(
        max_length=16, choices=SourceKind.choices, db_default=SourceKind.NOTE.value
    )
    author = models.CharField(max_length=200, blank=True, db_default="")
    path = models.CharField(max_length=1024, blank=True, db_default="")
    # Free-form groupings: a conversation or session, and a task shared
    # between the user's agents. NULL when absent, so the partial indexes
    # below stay small. A conversation's messages share one thread (whether
    # stored by remember(messages=...) or memory_add), and ``position`` is
    # each message's place in it, from 0.
    thread_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    position = models.PositiveIntegerField(null=True, blank=True)
    task_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    content = models.TextField()
    # SHA-256 of the normalised content; the unique constraint below is the
    # whole of deduplication, so concurrent identical writes cannot both land.
    content_hash = models.CharField(max_length=64)
    # No fixed width: the width follows the embedding model. Each model gets
    # its own partial HNSW index over ``embedding::vector(n)`` (see
    # memories/indexes.py), and searches always filter on embedding_model, so
    # vectors from two models are never compared.
    embedding = VectorField()
    embedding_model = models.CharField(max_length=100)
    metadata = models.JSONField(default=dict, blank=True)
    priority = models.CharField(
        max_length=8, choices=Priority.choices, db_default=Priority.MEDIUM.value
    )
    # Past this moment no tool returns the memory, and maintenance purges it.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Maintained by the memories_version trigger: 1 when created, one more for
    # each change a user can see. Each version is a row in memory_history.
    version = models.PositiveIntegerField(db_default=1)
    created_at = models.DateTimeField(db_default=Now())
    # Maintained by the memories_touch_updated_at trigger, not by Django.
    updated_at = models.DateTimeField(db_default=Now())
    # The later memory that replaced this one, and since when (issue 22). A
    # key in the database, ON DELETE SET NULL, and a trigger that keeps links
    # inside one user, namespace and writer (migration 0014); no Django
    # relation, so Django never emulates either.
    # What a memory replaced is ``WHERE superseded_by = its id``.
    superseded_by = models.UUIDField(null=True, blank=True)
    superseded_at = models.DateTimeField(null=True, blank=True)

    objects = MemoryQuerySet.as_manager()

    class Meta:
        db_table = "memories"
        verbose_name_plural = "memories"
        constraints = [
            # One copy per writer and place: an agent's memory never collides
            # with another agent's (which it cannot see), and the same chunk in
            # two documents, or the same words said twice in a conversation or
            # in two conversations, are two memories.
            models.UniqueConstraint(
                fields=[
                    "user",
                    "agent",
                    "namespace",
                    "thread_id",
                    "position",
                    "task_id",
                    "path",
                    "content_hash",
                ],
                name="memories_dedup",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=models.Q(source_kind__in=SourceKind.values),
                name="memories_source_kind_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(priority__in=Priority.values), name="memories_priority_valid"
            ),
        ]
        indexes = [
            # Used by agent-scoped searches and listings, and by agent deletion.
            models.Index(fields=["user", "agent"], name="memories_agent_idx"),
            # Used by memory_search's and memory_filters' source filters.
            models.Index(fields=["user", "source_kind"], name="memories_source_kind_idx"),
            models.Index(fields=["user", "author"], name="memories_author_idx"),
            models.Index(fields=["user", "path"], name="memories_path_idx"),
            # Used by the thread_id filters, and by list_memories(thread_id=...):
            # a conversation in order.
            models.Index(
                fields=["user", "thread_id", "position"],
                name="memories_thread_idx",
                condition=models.Q(thread_id__isnull=False),
            ),
            models.Index(
                fields=["user", "task_id"],
                name="memories_task_idx",
                condition=models.Q(task_id__isnull=False),
            ),
            # Used by maintenance, which purges expired memories across users.
            models.Index(
                fields=["expires_at"],
                name="memories_expires_idx",
                condition=models.Q(expires_at__isnull=False),
            ),
            # Used by list_memories(order="created_at").
            models.Index(
                "user", "namespace", models.F("created_at").desc(), name="memories_list_created_idx"
            ),
            # Used by list_memories(order="updated_at").
            models.Index(
                "user", "namespace", models.F("updated_at").desc(), name="memories_list_updated_idx"
            ),
            # Used by recall's metadata_filter (containment, @>). New entries go
            # straight into the index, not a pending list every search reads
            # (migration 0011).
            GinIndex(
                fields=["metadata"],
                opclasses=["jsonb_path_ops"],
                name="memories_metadata_gin",
                fastupdate=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.id}"


class ForgetConfirmation(models.Model):
    """A pending ``forget(mode="by_query")``: the previewed ids, awaiting confirmation.

    Only a SHA-256 of the token is stored. Confirming deletes exactly
    ``memory_ids`` and this row, so a token works once.
    """

    token_hash = models.CharField(max_length=64, primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # The agent that asked for the preview: only it can confirm (RLS).
    agent = models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    memory_ids = ArrayField(models.UUIDField())
    # For forget(mode="all"): the namespace, and the moment of the preview.
    # Confirming deletes the namespace's memories created up to then.
    namespace = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    cutoff = models.DateTimeField(null=True, blank=True)
    # The preview asked for the deleted memories' history to go too.
    purge = models.BooleanField(db_default=False)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "forget_confirmations"
        indexes = [
            # Used when a preview sweeps the user's expired confirmations.
            models.Index(fields=["user", "expires_at"], name="forget_conf_user_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{len(self.memory_ids)} memories until {self.expires_at:%H:%M:%S}"


class Action(models.TextChoices):
    CREATED = "created", "Created"
    UPDATED = "updated", "Updated"
    DELETED = "deleted", "Deleted"
    # A later memory replaced this one, or the link was undone (issue 22).
    SUPERSEDED = "superseded", "Superseded"
    RESTORED = "restored", "Restored"


class MemoryHistory(models.Model):
    """One version of a memory, as it was after a change (or just before its deletion).

    Written only by the ``memories_history`` trigger, in the transaction that
    made the change, with the client and key that transaction named (see
    ``tenancy.tenant``). The tenant path may read and add rows, never change
    or delete them; rows go only through ``recall_purge_history()`` (forget
    with purge) and the retention purge on the operator path.
    """

    id = models.BigAutoField(primary_key=True)
    # No foreign key: history outlives the memory it describes.
    memory_id = models.UUIDField()
    # ON DELETE CASCADE in the database (migration 0005): deleting a user
    # removes their history, including rows the deletion itself writes,
    # which Django's own cascade would collect too early.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    # The memory's agent (NULL for a user-wide memory): an agent reads only
    # its own memories' history, as it reads only its own memories (RLS).
    # No key to agents: like the memory_id, it outlives what it names (an
    # agent's deletion deletes its memories, whose history stays its time).
    agent = models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    version = models.PositiveIntegerField()
    action = models.CharField(max_length=10, choices=Action.choices)
    namespace = models.CharField(max_length=64)
    content = models.TextField()
    metadata = models.JSONField(default=dict)
    priority = models.CharField(max_length=8, choices=Priority.choices)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Who made the change: the interface (mcp, v1, agent, stdio, dashboard,
    # worker, import, admin, maintenance) and, through a key, the key.
    client = models.CharField(max_length=32)
    api_key_id = models.UUIDField(null=True, blank=True)
    recorded_at = models.DateTimeField()
    # What replaced the memory at this version; on a memory's ``created`` row,
    # what it replaced; on a ``superseded``, ``restored`` or such ``created``
    # row, who decided and why ({"decided_by": "explicit" | "offline" | "llm"
    # | "undo" | "restated", "reason", "score", "model"}).
    superseded_by = models.UUIDField(null=True, blank=True)
    replaces = ArrayField(models.UUIDField(), null=True, blank=True)
    decision = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "memory_history"
        verbose_name_plural = "memory history"
        constraints = [
            # Also used by memory_history: one memory's versions in order.
            models.UniqueConstraint(fields=["memory_id", "version"], name="memory_history_version"),
        ]
        indexes = [
            # Used by the dashboard's history page: a user's latest changes.
            models.Index(
                "user", models.F("recorded_at").desc(), name="memory_history_user_time_idx"
            ),
            # Used by the retention purge: deletions older than HISTORY_RETENTION_DAYS.
            models.Index(
                fields=["recorded_at"],
                name="memory_history_deleted_idx",
                condition=models.Q(action="deleted"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.memory_id} v{self.version} {self.action}"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


@dataclass(frozen=True)
class Taken:
    """A job a worker has just taken: who it runs as, and what to store.

    ``attempts`` also names this run: only taking a job changes it, so the
    job is still this run's while it is running with the same count.
    """

    id: uuid.UUID
    user_id: uuid.UUID
    agent_id: uuid.UUID | None
    payload: dict[str, Any]
    attempts: int
    client: str
    api_key_id: uuid.UUID | None
    kind: str = "remember"
    # What a job saved as it ran (an import's progress), to resume from.
    result: dict[str, Any] | None = None


# The oldest job due of one sort (an import, or any other), or a running one
# whose lease ran out. A conversation's job waits while an earlier one of its
# thread is unfinished: its turns go after that job's, so two workers must
# not take them together. An import waits while another import of its user
# runs: one user's uploads run one after another, not on every worker.
_TAKE_NEXT = (
    "UPDATE memory_jobs SET status = 'running', attempts = attempts + 1,"
    " lost_runs = lost_runs + (status = 'running')::int,"
    " started_at = statement_timestamp(),"
    " lease_until = statement_timestamp() + make_interval(secs => %s)"
    " WHERE id = (SELECT id FROM memory_jobs j"
    "   WHERE ((status = 'queued' AND run_after <= statement_timestamp())"
    "      OR (status = 'running' AND lease_until < statement_timestamp()"
    "          AND lost_runs + 1 < %s))"
    "   AND (j.kind = 'import') = %s"
    "   AND NOT (j.kind = 'import' AND EXISTS (SELECT FROM memory_jobs r"
    "     WHERE r.user_id = j.user_id AND r.kind = 'import' AND r.id <> j.id"
    "     AND r.status = 'running' AND r.lease_until >= statement_timestamp()))"
    "   AND NOT EXISTS (SELECT FROM memory_jobs e WHERE e.user_id = j.user_id"
    "     AND coalesce(e.agent_id::text, '') = coalesce(j.agent_id::text, '')"
    "     AND e.status IN ('queued', 'running') AND e.kind = 'remember'"
    "     AND (e.created_at, e.id) < (j.created_at, j.id)"
    "     AND coalesce((j.payload->>'conversation')::boolean, false)"
    "     AND coalesce((e.payload->>'conversation')::boolean, false)"
    "     AND e.payload->>'thread_id' = j.payload->>'thread_id'"
    "     AND e.payload->>'namespace' = j.payload->>'namespace')"
    "   ORDER BY run_after LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " RETURNING id, user_id, agent_id, payload, attempts, client, api_key_id,"
    " kind, result"
)


_IMPORTS_TAKEN_ONE_AT_A_TIME = "SELECT pg_advisory_xact_lock(hashtextextended('take-import', 5))"


class JobQuerySet(models.QuerySet["Job"]):
    """A job's life: queued, running under a lease, then done or failed (or queued again).

    Each transition is one statement. Taking reads across tenants, so callers
    run it on the operator path; settling runs in the tenant transaction that
    stored the job's memories. A lease that ran out lets another worker take
    the job while the first may still be running it, so a run's transitions
    name it (``attempts``) and change nothing once the job is no longer its own.
    """

    def take_next(
        self, lease_seconds: float, lost_runs: int, *, imports: bool = True
    ) -> Taken | None:
        """Take the oldest due job, or a running one whose lease ran out; None when none is.

        Adds and other short jobs come before imports, whatever their age: an
        import holds its worker for minutes, and an add queued behind a
        user's uploads waited for all of them (review140). ``imports=False``
        takes no import at all. A job whose lease ran out is taken over only
        while fewer than ``lost_runs`` of its runs have been lost so, this one
        included (``give_up_lost`` fails the others). Locked with SKIP
        LOCKED, so concurrent workers each take another.
        """
        taken = None
        with transaction.atomic(), connection.cursor() as cursor:
            for importing in (False, True) if imports else (False,):
                if importing:
                    # One worker at a time takes an import, until its take commits:
                    # another's statement would not see an import taken but not yet
                    # committed, and would take the same user's next (review148).
                    cursor.execute(_IMPORTS_TAKEN_ONE_AT_A_TIME)
                cursor.execute(_TAKE_NEXT, [lease_seconds, lost_runs, importing])
                taken = cursor.fetchone()
                if taken is not None:
                    break
        if taken is None:
            return None
        job_id, user_id, agent_id, payload, attempts, client, api_key_id, kind, result = taken
        # Django has psycopg hand jsonb over as text.
        if isinstance(payload, str):
            payload = json.loads(payload)
        if isinstance(result, str):
            result = json.loads(result)
        return Taken(job_id, user_id, agent_id, payload, attempts, client, api_key_id, kind, result)

    def give_up_lost(self, lost_runs: int, code: str, message: str) -> int:
        """Fail each job whose lease ran out on its ``lost_runs``-th lost run; return how many.

        Such a job lost its worker (or hung past ``JOB_MAX_RUN_SECONDS``) run
        after run: one that kills or hangs whatever runs it would otherwise be
        taken again for ever. As when a run fails it, a job's payload (the
        content) goes, and an import's file pieces go while its payload (the
        file's name and options) stays.
        """
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH lost AS ("
                "  UPDATE memory_jobs SET status = 'failed',"
                "   payload = CASE WHEN kind = 'import' THEN payload END,"
                "   error_code = %s, error_message = %s, finished_at = statement_timestamp(),"
                "   lease_until = NULL"
                "  WHERE id IN (SELECT id FROM memory_jobs"
                "    WHERE status = 'running' AND lease_until < statement_timestamp()"
                "      AND lost_runs + 1 >= %s"
                "    FOR UPDATE SKIP LOCKED)"
                "  RETURNING id, kind),"
                " pieces AS (DELETE FROM memory_import_chunks c USING lost"
                "  WHERE c.job_id = lost.id AND lost.kind = 'import')"
                " SELECT count(*) FROM lost",
                [code, message[:500], lost_runs],
            )
            return int(cursor.fetchone()[0])

    def held(self, job_id: uuid.UUID, attempts: int | None) -> JobQuerySet:
        """Return the job while the run that took it as attempt ``attempts`` still has it.

        ``None`` names no run: the job, whoever runs it.
        """
        if attempts is None:
            return self.filter(id=job_id)
        return self.filter(id=job_id, status=JobStatus.RUNNING, attempts=attempts)

    def extend_leases(self, runs: Iterable[tuple[uuid.UUID, int]], lease_seconds: float) -> int:
        """Extend the leases of the jobs these runs (id, attempts) still hold; return how many."""
        theirs = models.Q()
        for job_id, attempts in runs:
            theirs |= models.Q(id=job_id, attempts=attempts)
        if not theirs:
            return 0
        return self.filter(theirs, status=JobStatus.RUNNING).update(
            lease_until=Now() + timedelta(seconds=lease_seconds)
        )

    def settle(
        self, job_id: uuid.UUID, user_id: uuid.UUID, results: list[Any], *, attempts: int
    ) -> bool:
        """Mark a job done with what it stored: its payload (the content) goes.

        Return False, changing nothing, when the run is no longer the job's:
        the caller must then roll back what it stored. The row stays locked
        until the caller's transaction ends, so no other worker can take the
        job meanwhile.
        """
        settled = (
            self.held(job_id, attempts)
            .filter(user_id=user_id)
            .update(
                status=JobStatus.DONE,
                payload=None,
                result={"memories": results, "memory_ids": [r["id"] for r in results]},
                finished_at=Now(),
                lease_until=None,
            )
        )
        return settled == 1

    def failures(self, job_id: uuid.UUID) -> int:
        """How many of a job's runs failed for a passing reason and queued it again."""
        return self.filter(id=job_id).values_list("failures", flat=True).first() or 0

    def retry_later(
        self, job_id: uuid.UUID, seconds: float, *, attempts: int | None = None
    ) -> bool:
        """Queue a job again, due in ``seconds``, one failure more; False if the run no
        longer has it."""
        queued = self.held(job_id, attempts).update(
            status=JobStatus.QUEUED,
            run_after=Now() + timedelta(seconds=seconds),
            lease_until=None,
            failures=models.F("failures") + 1,
        )
        return queued == 1

    def fail(
        self, job_id: uuid.UUID, code: str, message: str, *, attempts: int | None = None
    ) -> bool:
        """Mark a job failed with an error code and message; its payload (the content) goes.

        Return False, changing nothing, when the run no longer has the job.
        """
        failed = self.held(job_id, attempts).update(
            status=JobStatus.FAILED,
            payload=None,
            error_code=code,
            error_message=message[:500],
            finished_at=Now(),
            lease_until=None,
        )
        return failed == 1


class Job(models.Model):
    """A background add: queued by ``remember(async=true)``, run by a worker.

    Workers take due jobs with ``FOR UPDATE SKIP LOCKED`` (memories/jobs.py).
    The payload (the content to store) is cleared when the job ends, so a
    finished job holds ids and an outcome, never memory content.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # ON DELETE CASCADE in the database, as for MemoryHistory.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    # The agent that queued it (NULL: user-wide); the worker stores the
    # memories as that agent, and only it sees the job (RLS).
    agent = models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    kind = models.CharField(max_length=16, default="remember")
    status = models.CharField(max_length=8, choices=JobStatus.choices, default=JobStatus.QUEUED)
    # The caller's own key for retries: the same key returns the same job.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # SHA-256 of the validated request, to refuse a key reused for another one.
    request_hash = models.CharField(max_length=64)
    payload = models.JSONField(null=True, blank=True)
    # How many memories the job may add, counted against the free tier's quota
    # while it waits.
    items = models.PositiveIntegerField(default=1)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    error_message = models.CharField(max_length=500, blank=True, default="")
    attempts = models.PositiveSmallIntegerField(default=0)
    # Runs that lost the job to a lease that ran out (their worker died or
    # hung): taken over up to ``queue.LOST_RUNS`` times. An import's saved
    # progress clears it, so an import that moves on between restarts goes on.
    lost_runs = models.PositiveSmallIntegerField(db_default=0)
    # Runs that failed for a passing reason and queued the job again: a job
    # fails on the run that would make them JOB_MAX_ATTEMPTS. Lost runs are
    # not failures of the job's own.
    failures = models.PositiveSmallIntegerField(db_default=0)
    # Who queued it; the worker acts as them, so history names them too.
    client = models.CharField(max_length=32, blank=True, default="")
    api_key_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    run_after = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    # A worker's heartbeat extends it while the job runs (memories/jobs.py): a
    # running job whose lease has passed lost its worker, and is taken again.
    lease_until = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "memory_jobs"
        constraints = [
            # Per writer: two agents, who cannot see each other's jobs, may
            # choose the same key.
            models.UniqueConstraint(
                fields=["user", "agent", "idempotency_key"],
                name="memory_jobs_idempotency",
                condition=models.Q(idempotency_key__isnull=False),
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=JobStatus.values), name="memory_jobs_status_valid"
            ),
        ]
        indexes = [
            # Used by workers taking the next due job.
            models.Index(
                fields=["run_after"],
                name="memory_jobs_due_idx",
                condition=models.Q(status="queued"),
            ),
            # Used by workers reclaiming jobs whose worker died.
            models.Index(
                fields=["lease_until"],
                name="memory_jobs_lease_idx",
                condition=models.Q(status="running"),
            ),
            # Used by the quota check at enqueue: the user's waiting jobs.
            models.Index(
                fields=["user"],
                name="memory_jobs_pending_idx",
                condition=models.Q(status__in=["queued", "running"]),
            ),
            # Used by maintenance, which removes finished jobs after JOB_RETENTION_DAYS.
            models.Index(
                fields=["finished_at"],
                name="memory_jobs_finished_idx",
                condition=models.Q(finished_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"


class ImportChunk(models.Model):
    """A piece of a file uploaded on the dashboard for import, kept until its job ends.

    In the database rather than on a disk, so that whichever process or
    machine runs the job can read it. The job deletes its pieces when it
    finishes or fails, and they go with the job in any case (ON DELETE CASCADE).
    """

    id = models.BigAutoField(primary_key=True)
    # ON DELETE CASCADE in the database (migration 0014), as for Job: deleting a
    # user or a finished job (maintenance) takes its pieces, whoever deletes.
    job = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=False,
    )
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        db_table = "memory_import_chunks"
        constraints = [
            # Also used by the job reading its file back, piece by piece, in order.
            models.UniqueConstraint(fields=["job", "seq"], name="memory_import_chunks_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} piece {self.seq}"
