from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class UsageEvent(models.Model):
    """One authenticated tool call: the unit of billing and of the usage dashboard."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: usage_events_user_time_idx leads with user_id, and
    # every index on this table costs a write per tool call.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    # SET_NULL in the database too (migration 0010): deleting an agent deletes its
    # keys there, not through Django. A change to this field must keep that.
    api_key = models.ForeignKey(
        "accounts.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The agent the call acted as (an OAuth connection or an agent-scoped
    # key); NULL for user-wide keys. Kept when the agent goes: usage is billed.
    agent = models.ForeignKey(
        "accounts.Agent",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    request_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=64)
    tokens_consumed = models.PositiveSmallIntegerField(default=1)
    latency_ms = models.PositiveIntegerField(default=0)
    success = models.BooleanField()
    # NULL on success: no code at all, rather than an empty one.
    error_code = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    occurred_at = models.DateTimeField(db_default=Now())
    # Chosen by the recorder when the call happens. Unique, so that a batch
    # retried after a failure that may have committed (the connection died
    # before the COMMIT's answer) is stored once; NULL on older rows.
    event_id = models.UUIDField(unique=True, null=True, blank=True, editable=False)

    class Meta:
        db_table = "usage_events"
        indexes = [
            # Used by the usage dashboard: one user's events over a date range.
            # Also serves the admin's user filter.
            models.Index(fields=["user", "occurred_at"], name="usage_events_user_time_idx"),
            # Used to correlate a log line with its event (and the admin's search).
            models.Index(fields=["request_id"], name="usage_events_request_idx"),
            # Used by the admin list and the CSV export, newest first, and by the
            # admin's date filter: ORDER BY occurred_at DESC, id DESC LIMIT 100.
            models.Index(fields=["occurred_at", "id"], name="usage_events_time_idx"),
            # Used by the admin's tool filter:
            # WHERE tool_name = %s ORDER BY occurred_at DESC.
            models.Index(fields=["tool_name", "occurred_at"], name="usage_events_tool_time_idx"),
            # Used by the admin's error-code filter:
            # WHERE error_code = %s ORDER BY occurred_at DESC. Partial, because
            # successes, most of the table, have no code.
            models.Index(
                fields=["error_code", "occurred_at"],
                name="usage_events_error_time_idx",
                condition=models.Q(error_code__isnull=False),
            ),
            # Used by the admin's success filter when it asks for failures:
            # WHERE NOT success ORDER BY occurred_at DESC.
            models.Index(
                fields=["occurred_at"],
                name="usage_events_failed_time_idx",
                condition=models.Q(success=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.request_id}"


class BillingAccount(models.Model):
    """A user's link to Stripe and MCPize. The tier itself lives on the user and their keys."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="billing"
    )
    # Set by checkout.session.completed; the webhook finds users by it.
    stripe_customer_id = models.CharField(max_length=255, unique=True, null=True, blank=True)
    # The signed timestamp of the newest MCPize delivery applied: MCPize, like
    # Stripe, may deliver late, and an older delivery is stale.
    mcpize_event_created = models.DateTimeField(null=True, blank=True)
    # The tier MCPize last billed the user for. A Stripe subscription may bill
    # them too: the user's tier is the higher of the two, so neither source's
    # event lowers a tier the other is paid for.
    mcpize_tier = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_accounts"

    def __str__(self) -> str:
        return self.stripe_customer_id or "(no Stripe customer)"


class SubscriptionManager(models.Manager["Subscription"]):
    def for_user(self, user_id: uuid.UUID | str) -> models.QuerySet[Subscription]:
        return self.filter(user_id=user_id).order_by("-event_created")


class Subscription(models.Model):
    """One Stripe subscription as of the newest event applied to it.

    ``event_created`` is that event's ``created`` time. Stripe does not
    deliver in order, so an event older than it is stale and changes nothing.
    """

    id = models.CharField(max_length=255, primary_key=True)  # Stripe's sub_...
    customer_id = models.CharField(max_length=255)
    # Unknown until the customer is linked to a user (checkout, or metadata).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="subscriptions",
    )
    status = models.CharField(max_length=32)
    price_id = models.CharField(max_length=255, blank=True)
    event_id = models.CharField(max_length=255)
    event_created = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    objects = SubscriptionManager()

    class Meta:
        db_table = "billing_subscriptions"
        indexes = [
            # Used when checkout links a customer: its subscriptions get the user.
            models.Index(fields=["customer_id"], name="billing_subs_customer_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class WebhookEvent(models.Model):
    """A webhook delivery already handled: a replay is acknowledged and does nothing."""

    class Source(models.TextChoices):
        STRIPE = "stripe", "Stripe"
        MCPIZE = "mcpize", "MCPize"

    source = models.CharField(max_length=16, choices=Source.choices)
    # Stripe's event id; for MCPize the Idempotency-Key header or the signature.
    event_id = models.CharField(max_length=255)
    event_type = models.CharField(max_length=100, blank=True)
    received_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "billing_webhook_events"
        constraints = [
            models.UniqueConstraint(fields=["source", "event_id"], name="billing_webhook_once"),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.event_id}"


class WebhookRejection(models.Model):
    """A correctly signed delivery refused for its content, for an operator to look into.

    Authentic but unusable (a string PostgreSQL cannot store, a field of the
    wrong shape, an unknown user): answered 4xx with ``reason``, with nothing
    else written. The strings kept are scrubbed copies, cut to fit.
    """

    source = models.CharField(max_length=16, choices=WebhookEvent.Source.choices)
    event_id = models.CharField(max_length=255, blank=True)
    event_type = models.CharField(max_length=100, blank=True)
    reason = models.CharField(max_length=255)
    status = models.PositiveSmallIntegerField()
    received_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "billing_webhook_rejections"
        # The admin's list, newest first.
        indexes = [models.Index(fields=["-received_at"], name="billing_rejections_recent")]

    def __str__(self) -> str:
        return f"{self.source} {self.event_id or '(no id)'}: {self.reason}"
