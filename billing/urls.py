from __future__ import annotations

from django.urls import path

from billing import webhooks

app_name = "billing"

urlpatterns = [
    path("billing/stripe/webhook", webhooks.stripe_webhook, name="stripe-webhook"),
    path("webhooks/mcpize/subscription", webhooks.mcpize_webhook, name="mcpize-webhook"),
]
