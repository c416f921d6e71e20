from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class UsageEvent(models.Model):
    """One authenticated tool call: the unit of billing and of the usage dashboard."""

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(
        "accounts.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    request_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=64)
    tokens_consumed = models.PositiveSmallIntegerField(default=1)
    latency_ms = models.PositiveIntegerField(default=0)
    success = models.BooleanField()
    # NULL on success: no code at all, rather than an empty one.
    error_code = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    occurred_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "usage_events"
        indexes = [
            # Used by the usage dashboard: one user's events over a date range.
            models.Index(fields=["user", "occurred_at"], name="usage_events_user_time_idx"),
            # Used to correlate a log line with its event.
            models.Index(fields=["request_id"], name="usage_events_request_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.request_id}"
