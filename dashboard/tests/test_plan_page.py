from __future__ import annotations

import pytest

from billing.models import BillingAccount
from billing.tests.fake_stripe import FakeStripe
from core import csp

URL = "/plan/"
PRICES = {"price_starter": "starter", "price_pro": "pro", "price_team": "team"}


@pytest.fixture
def fake_stripe(settings):
    fake = FakeStripe().start()
    settings.STRIPE_SECRET_KEY = "sk_test_recall"
    settings.STRIPE_PRICE_TO_TIER = PRICES
    settings.STRIPE_API_BASE = fake.url
    yield fake
    fake.stop()


def test_it_shows_the_current_tier_and_the_limits(cast, alice_client):
    text = alice_client.get(URL).content.decode()

    assert "data-current-tier>Free<" in text
    assert "10 per minute" in text
    assert "unlimited" in text


def test_the_unlimited_tier_is_shown_only_to_those_granted_it(cast, alice_client, fake_stripe):
    assert "Unlimited" not in alice_client.get(URL).content.decode()

    type(cast.alice).objects.filter(id=cast.alice.id).update(tier="unlimited")
    text = alice_client.get(URL).content.decode()

    assert "data-current-tier>Unlimited<" in text
    assert "no limit" in text
    assert "granted by this server's operator" in text
    assert "Upgrade" not in text


def test_without_stripe_it_offers_no_upgrade(cast, alice_client):
    text = alice_client.get(URL).content.decode()

    assert "Upgrade" not in text
    assert "managed by its operator" in text
    assert alice_client.post("/plan/checkout/", {"tier": "pro"}).status_code == 404
    assert alice_client.post("/plan/portal/").status_code == 404


def test_coming_back_from_checkout_claims_no_payment(cast, alice_client, fake_stripe, settings):
    # Anyone can type ?checkout=success: it said the payment went through.
    back = alice_client.get("/plan/?checkout=success").content.decode()
    assert "Back from checkout" in back and "went through" not in back
    settings.STRIPE_SECRET_KEY = ""
    assert "Back from checkout" not in alice_client.get("/plan/?checkout=success").content.decode()


def test_with_stripe_it_offers_the_tiers_above_the_current_one(cast, alice_client, fake_stripe):
    type(cast.alice).objects.filter(id=cast.alice.id).update(tier="starter")

    text = alice_client.get(URL).content.decode()

    assert "Upgrade to Pro" in text
    assert "Upgrade to Team" in text
    assert "Upgrade to Starter" not in text


def test_upgrading_starts_stripe_checkout_for_this_user(cast, alice_client, fake_stripe):
    response = alice_client.post("/plan/checkout/", {"tier": "pro"})

    assert response.status_code == 302
    assert response["Location"].startswith("https://checkout.stripe.test/c/pay/cs_test_")
    made, sent = fake_stripe.requests
    # Her customer first, linked before she pays (see the next test for why).
    assert made.path == "/v1/customers"
    assert made.form == {
        "email": "alice@example.com",
        "metadata[recall_user_id]": str(cast.alice.id),
    }
    assert made.headers["Idempotency-Key"].startswith(f"recall-customer-{cast.alice.id}-")
    assert BillingAccount.objects.get(user=cast.alice).stripe_customer_id == "cus_fake_1"
    assert sent.path == "/v1/checkout/sessions"
    assert sent.headers["Authorization"] == "Bearer sk_test_recall"
    assert sent.form["mode"] == "subscription"
    assert sent.form["line_items[0][price]"] == "price_pro"
    assert sent.form["client_reference_id"] == str(cast.alice.id)
    assert sent.form["customer"] == "cus_fake_1"
    assert "customer_email" not in sent.form
    assert sent.form["subscription_data[metadata][recall_user_id]"] == str(cast.alice.id)
    assert sent.form["success_url"] == "http://testserver/plan/?checkout=success"
    assert sent.form["cancel_url"] == "http://testserver/plan/?checkout=cancelled"


@pytest.mark.django_db(transaction=True)
def test_two_checkouts_started_at_once_are_one_customers(cast, fake_stripe):
    # Given only an email, Stripe made a customer per session: two tabs made
    # two, the second's link replaced the first's, and the first subscription
    # could not be managed (or cancelled) from the dashboard.
    from django.test import Client

    from tests.support import at_once

    def checkout() -> int:
        browser = Client()
        browser.force_login(cast.alice)
        return browser.post("/plan/checkout/", {"tier": "pro"}).status_code

    assert at_once(2, checkout) == [302, 302]

    sessions = [r for r in fake_stripe.requests if r.path == "/v1/checkout/sessions"]
    assert [r.form["customer"] for r in sessions] == ["cus_fake_1", "cus_fake_1"]
    assert BillingAccount.objects.get(user=cast.alice).stripe_customer_id == "cus_fake_1"


def test_a_customer_stripe_hands_back_that_another_user_holds_is_not_taken(
    cast, alice_client, fake_stripe
):
    # Stripe answers a key it saw in the last day with the customer it made
    # then; if that customer was linked to someone else since, linking it
    # here took it (and their tier) from them.
    alice_client.post("/plan/checkout/", {"tier": "pro"})
    key = fake_stripe.requests[0].headers["Idempotency-Key"]
    BillingAccount.objects.filter(user=cast.alice).update(stripe_customer_id=None)
    BillingAccount.objects.create(user=cast.charlie, stripe_customer_id="cus_fake_1")
    assert fake_stripe.customers == {key: "cus_fake_1"}

    response = alice_client.post("/plan/checkout/", {"tier": "pro"}, follow=True)

    assert "Payments are unavailable right now" in response.content.decode()
    assert BillingAccount.objects.get(user=cast.charlie).stripe_customer_id == "cus_fake_1"
    assert BillingAccount.objects.get(user=cast.alice).stripe_customer_id is None


def test_a_linked_customer_checks_out_as_itself(cast, alice_client, fake_stripe):
    BillingAccount.objects.create(user=cast.alice, stripe_customer_id="cus_alice")

    alice_client.post("/plan/checkout/", {"tier": "team"})

    [sent] = fake_stripe.requests
    assert sent.form["customer"] == "cus_alice"
    assert "customer_email" not in sent.form


def test_a_tier_without_a_price_cannot_be_bought(cast, alice_client, fake_stripe):
    response = alice_client.post("/plan/checkout/", {"tier": "free"}, follow=True)

    assert fake_stripe.requests == []
    assert "cannot be bought here" in response.content.decode()


def test_the_portal_opens_for_a_linked_customer(cast, alice_client, fake_stripe):
    BillingAccount.objects.create(user=cast.alice, stripe_customer_id="cus_alice")
    assert "Manage billing" in alice_client.get(URL).content.decode()

    response = alice_client.post("/plan/portal/")

    assert response.status_code == 302
    assert response["Location"].startswith("https://billing.stripe.test/p/session/")
    [sent] = fake_stripe.requests
    assert sent.path == "/v1/billing_portal/sessions"
    assert sent.form == {"customer": "cus_alice", "return_url": "http://testserver/plan/"}


def test_there_is_no_portal_before_a_first_checkout(cast, alice_client, fake_stripe):
    assert "Manage billing" not in alice_client.get(URL).content.decode()

    response = alice_client.post("/plan/portal/", follow=True)

    assert fake_stripe.requests == []
    assert "no subscription to manage" in response.content.decode()


def test_a_stripe_outage_is_explained_not_raised(cast, alice_client, fake_stripe):
    fake_stripe.fail_with = 500

    response = alice_client.post("/plan/checkout/", {"tier": "pro"}, follow=True)

    assert response.status_code == 200
    assert "Payments are unavailable right now" in response.content.decode()


def test_charlie_checks_out_as_charlie(cast, charlie_client, fake_stripe):
    BillingAccount.objects.create(user=cast.alice, stripe_customer_id="cus_alice")

    charlie_client.post("/plan/checkout/", {"tier": "pro"})
    charlie_client.post("/plan/portal/")

    made, sent, portal = fake_stripe.requests
    assert made.form["email"] == "charlie@example.com"
    assert sent.form["client_reference_id"] == str(cast.charlie.id)
    assert sent.form["customer"] == portal.form["customer"] == "cus_fake_1"
    assert BillingAccount.objects.get(user=cast.alice).stripe_customer_id == "cus_alice"


def test_with_stripe_the_plans_forms_may_lead_on_to_stripes_pages(cast, alice_client, fake_stripe):
    # Upgrade and Manage billing post here and are redirected to Stripe, which
    # Chromium checks against the page's form-action too.
    policy = alice_client.get(URL).headers["Content-Security-Policy"]

    assert policy == csp.POLICY.replace(
        "form-action 'self'",
        "form-action 'self' https://checkout.stripe.com https://billing.stripe.com",
    )


def test_without_stripe_the_plans_forms_stay_here(cast, alice_client):
    assert alice_client.get(URL).headers["Content-Security-Policy"] == csp.POLICY
