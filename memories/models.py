from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now
from pgvector.django import VectorField


class Memory(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories", db_index=False
    )
    namespace = models.CharField(max_length=64, default="default")
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
            models.UniqueConstraint(
                fields=["user", "namespace", "content_hash"], name="memories_dedup"
            ),
        ]
        indexes = [
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
