from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now
from pgvector.django import VectorField


class SourceKind(models.TextChoices):
    CONVERSATION = "conversation", "Conversation"
    DOCUMENT = "document", "Document"
    NOTE = "note", "Note"


class Memory(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories", db_index=False
    )
    # NULL for memories written with a user-wide API key: they belong to the
    # user. Otherwise the agent that wrote it, which alone may see it (plus
    # task sharing); row-level security enforces that, see recall/tenancy.py.
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
    # below stay small.
    thread_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
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
    created_at = models.DateTimeField(db_default=Now())
    # Maintained by the memories_touch_updated_at trigger, not by Django.
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "memories"
        verbose_name_plural = "memories"
        constraints = [
            # One copy per writer and place: an agent's memory never collides
            # with another agent's (which it cannot see), and the same chunk in
            # two documents or the same words in two threads are two memories.
            models.UniqueConstraint(
                fields=[
                    "user",
                    "agent",
                    "namespace",
                    "thread_id",
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
        ]
        indexes = [
            # Used by agent-scoped searches and listings, and by agent deletion.
            models.Index(fields=["user", "agent"], name="memories_agent_idx"),
            # Used by memory_search's and memory_filters' source filters.
            models.Index(fields=["user", "source_kind"], name="memories_source_kind_idx"),
            models.Index(fields=["user", "author"], name="memories_author_idx"),
            models.Index(fields=["user", "path"], name="memories_path_idx"),
            models.Index(
                fields=["user", "thread_id"],
                name="memories_thread_idx",
                condition=models.Q(thread_id__isnull=False),
            ),
            models.Index(
                fields=["user", "task_id"],
                name="memories_task_idx",
                condition=models.Q(task_id__isnull=False),
            ),
            # Used by list_memories(order="created_at").
            models.Index(
                "user", "namespace", models.F("created_at").desc(), name="memories_list_created_idx"
            ),
            # Used by list_memories(order="updated_at").
            models.Index(
                "user", "namespace", models.F("updated_at").desc(), name="memories_list_updated_idx"
            ),
            # Used by recall's metadata_filter (containment, @>).
            GinIndex(
                fields=["metadata"], opclasses=["jsonb_path_ops"], name="memories_metadata_gin"
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
