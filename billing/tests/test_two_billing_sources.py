"""A user billed through both Stripe and MCPize: the tier is the higher of the two.

Each source's events describe only what that source bills. A cancelled
Stripe subscription arriving after an MCPize upgrade used to set the user to
free, and an MCPize "free" lowered a user still paying through Stripe.
"""

from __future__ import annotations

import json
import time

import pytest

from accounts.models import User
from billing.tests.stripe_events import PRICES, checkout_completed, deliver, subscription
from billing.tests.stripe_events import SECRET as STRIPE_SECRET
from billing.tests.test_mcpize_webhook import SECRET as MCPIZE_SECRET
from billing.tests.test_mcpize_webhook import post as mcpize


@pytest.fixture(autouse=True)
def both_sources(settings):
    settings.STRIPE_WEBHOOK_SECRET = STRIPE_SECRET
    settings.STRIPE_PRICE_TO_TIER = PRICES
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = MCPIZE_SECRET


def tier_of(user: User) -> str:
    return User.objects.get(id=user.id).tier


def test_a_late_stripe_cancellation_keeps_the_tier_mcpize_bills(cast, client):
    now = int(time.time())
    deliver(client, checkout_completed(client_reference_id=str(cast.alice.id)))
    deliver(client, subscription(price="price_pro", created=now - 20))
    deliver(
        client, subscription("customer.subscription.deleted", status="canceled", created=now - 10)
    )
    assert mcpize(client, {"userId": str(cast.alice.id), "tier": "team"}).status_code == 200

    late = deliver(
        client,
        subscription("customer.subscription.updated", status="canceled", created=now),
    )

    assert json.loads(late.content)["outcome"] == "applied"
    assert tier_of(cast.alice) == "team"


def test_mcpize_going_free_keeps_the_tier_stripe_still_bills(cast, client):
    deliver(client, checkout_completed(client_reference_id=str(cast.alice.id)))
    deliver(client, subscription(price="price_pro"))
    mcpize(client, {"userId": str(cast.alice.id), "tier": "team"})
    assert tier_of(cast.alice) == "team"

    mcpize(client, {"userId": str(cast.alice.id), "tier": "free"})

    assert tier_of(cast.alice) == "pro"


def test_with_one_source_each_sets_the_tier_as_before(cast, client):
    mcpize(client, {"userId": str(cast.alice.id), "tier": "starter"})
    mcpize(client, {"userId": str(cast.charlie.id), "tier": "team"})
    mcpize(client, {"userId": str(cast.charlie.id), "tier": "free"})

    assert (tier_of(cast.alice), tier_of(cast.charlie)) == ("starter", "free")


def test_mcpize_leaves_the_tier_alone_while_a_stripe_price_is_unmapped(cast, client):
    # What the unmapped Stripe price grants is unknown: the Stripe path leaves
    # the tier as it is, and an MCPize "free" used to lower it anyway.
    now = int(time.time())
    deliver(client, checkout_completed(client_reference_id=str(cast.alice.id)))
    deliver(client, subscription(price="price_team", created=now - 10))
    deliver(
        client, subscription("customer.subscription.updated", price="price_mystery", created=now)
    )
    assert tier_of(cast.alice) == "team"

    answered = mcpize(client, {"userId": str(cast.alice.id), "tier": "free"})

    assert answered.json()["outcome"] == "unknown_price"
    assert tier_of(cast.alice) == "team"


def test_beside_an_unmapped_price_the_tier_may_rise_and_never_falls(cast, client):
    # Both sources answered "applied" and changed nothing: a customer paying
    # MCPize for Team stayed on Starter, and so did a cancelled Starter plan.
    now = int(time.time())
    deliver(client, checkout_completed(client_reference_id=str(cast.alice.id)))
    deliver(client, subscription(id="sub_starter", price="price_starter", created=now - 30))
    legacy = deliver(client, subscription(id="sub_legacy", price="price_mystery", created=now - 20))
    assert legacy.json()["outcome"] == "unknown_price"

    cancelled = deliver(
        client,
        subscription(
            "customer.subscription.deleted", id="sub_starter", status="canceled", created=now - 10
        ),
    )
    assert cancelled.json()["outcome"] == "unknown_price"
    assert tier_of(cast.alice) == "starter"  # what sub_legacy grants is unknown

    raised = mcpize(client, {"userId": str(cast.alice.id), "tier": "team"})

    assert raised.json()["outcome"] == "applied"
    assert tier_of(cast.alice) == "team"


@pytest.mark.django_db(transaction=True)
def test_a_checkout_and_mcpize_deliveries_for_one_user_at_once_all_apply(cast):
    # The checkout locked the user's billing account row, then waited for the
    # user's billing lock; an MCPize delivery took them the other way round:
    # PostgreSQL's deadlock detector failed one of them, a 500.
    from django.test import Client

    from tests.support import at_once

    user = str(cast.alice.id)
    senders = iter((["stripe"] + ["mcpize"] * 3) * 6)

    def send() -> int | str:
        sender = next(senders)
        try:
            if sender == "stripe":
                checkout = checkout_completed(client_reference_id=user)
                return deliver(Client(), checkout).status_code
            return mcpize(Client(), {"userId": user, "tier": "starter"}).status_code
        except Exception as exc:
            return type(exc).__name__

    for _ in range(6):
        assert at_once(4, send) == [200] * 4
    assert tier_of(cast.alice) == "starter"
