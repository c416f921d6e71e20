"""Stripe events as Stripe sends them, signed with stripe's own helper."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import stripe
from django.test import Client

SECRET = "whsec_test_secret"
PRICES = {"price_starter": "starter", "price_pro": "pro", "price_team": "team"}
URL = "/billing/stripe/webhook"

_ids = itertools.count(1)


def event(kind: str, obj: dict[str, Any], *, created: int | None = None) -> dict[str, Any]:
    return {
        "id": f"evt_test_{next(_ids)}",
        "object": "event",
        "api_version": "2025-01-27.acacia",
        "created": created if created is not None else int(time.time()),
        "type": kind,
        "livemode": False,
        "data": {"object": obj},
    }


def checkout_completed(
    *,
    customer: str = "cus_alice",
    client_reference_id: str | None = None,
    email: str | None = None,
    subscription: str = "sub_alice",
    created: int | None = None,
) -> dict[str, Any]:
    session = {
        "id": f"cs_test_{next(_ids)}",
        "object": "checkout.session",
        "mode": "subscription",
        "customer": customer,
        "client_reference_id": client_reference_id,
        "customer_details": {"email": email} if email else None,
        "customer_email": None,
        "subscription": subscription,
        "payment_status": "paid",
        "status": "complete",
    }
    return event("checkout.session.completed", session, created=created)


def subscription(
    kind: str = "customer.subscription.created",
    *,
    id: str = "sub_alice",
    customer: str = "cus_alice",
    status: str = "active",
    price: str = "price_pro",
    created: int | None = None,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    sub = {
        "id": id,
        "object": "subscription",
        "customer": customer,
        "status": status,
        "metadata": metadata or {},
        "items": {
            "object": "list",
            "data": [
                {
                    "id": f"si_{next(_ids)}",
                    "object": "subscription_item",
                    "price": {"id": price, "object": "price"},
                }
            ],
        },
    }
    return event(f"customer.subscription.{kind.rsplit('.', 1)[-1]}", sub, created=created)


def deliver(
    client: Client,
    payload: dict[str, Any] | str,
    *,
    secret: str = SECRET,
    timestamp: int | None = None,
    signature: str | None = None,
) -> Any:
    body = payload if isinstance(payload, str) else json.dumps(payload)
    header = signature
    if header is None:
        header = stripe.WebhookSignature.generate_signature_header(body, secret, timestamp)
    return client.post(URL, body, content_type="application/json", HTTP_STRIPE_SIGNATURE=header)
