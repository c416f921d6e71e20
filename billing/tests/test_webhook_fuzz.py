"""Correctly signed webhook bodies, fuzzed: never a 5xx, never a half-written delivery.

Stripe's own SDK signs every Stripe body and MCPize's documented HMAC every
MCPize one, so each reaches the handlers. The strings vary where the
database would be hurt: NUL characters, unpaired surrogates, values longer
than their columns (a status of 33-64 characters was a 500), non-ASCII and
empty ones. Every answer must be a 2xx, or a 4xx that wrote nothing but the
record of the refusal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounts.models import ApiKey, User
from billing.models import BillingAccount, Subscription, WebhookEvent, WebhookRejection
from billing.services import SUBSCRIPTION_EVENTS
from billing.tests import stripe_events
from billing.tests.test_mcpize_webhook import post as mcpize_post
from core import tenancy

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.STRIPE_WEBHOOK_SECRET = stripe_events.SECRET
    settings.STRIPE_PRICE_TO_TIER = stripe_events.PRICES
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = "mcpize-test-secret"


def hostile(limit: int) -> st.SearchStrategy[str]:
    """Strings PostgreSQL refuses, strings just past a column of ``limit``, and harmless ones."""
    over = st.integers(limit + 1, 2 * limit).map(lambda n: "x" * n)
    return st.one_of(
        st.builds(lambda a, b: f"{a}\x00{b}", st.text(max_size=8), st.text(max_size=8)),
        st.builds(lambda a: f"{a}\ud800", st.text(max_size=8)),
        over,
        over,
        st.integers(limit - 2, limit).map(lambda n: "é" * n),
        st.just(""),
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40),
    )


plausible = st.sampled_from(["cus_alice", "sub_alice", "price_pro", "active", "canceled"])
wrong_type = st.one_of(st.integers(), st.lists(st.integers(), max_size=2), st.none(), st.booleans())


def value(limit: int = 255) -> st.SearchStrategy[Any]:
    return st.one_of(hostile(limit), hostile(limit), hostile(limit), plausible, wrong_type)


def state() -> tuple[Any, ...]:
    """Everything a delivery may write, apart from the record of a refusal."""
    with tenancy.operator():
        return (
            sorted(Subscription.objects.values_list("id", "status", "price_id", "event_id")),
            sorted(BillingAccount.objects.values_list("user_id", "stripe_customer_id")),
            sorted(WebhookEvent.objects.values_list("source", "event_id")),
            sorted(User.objects.values_list("email", "tier")),
            sorted(ApiKey.objects.values_list("id", "tier")),
        )


def rejections() -> int:
    with tenancy.operator():
        return WebhookRejection.objects.count()


def check_delivery(send: Callable[[], Any]) -> int:
    before, refused_before = state(), rejections()

    response = send()

    assert response.status_code < 500, response.content
    if response.status_code >= 400:
        assert state() == before  # nothing half-written
        assert rejections() == refused_before + 1
        assert "\x00" not in response.content.decode("utf-8", "replace")
    return int(response.status_code)


# Where a Stripe body's strings go, and the column each may end up in. Each
# is fuzzed on its own, with its neighbours sometimes broken too: a single bad
# string among good ones is what reaches the database.
CHECKOUT = "checkout.session.completed"
TARGETS = [
    *(
        (CHECKOUT, path, limit)
        for path, limit in [
            (("id",), 255),
            (("type",), 100),
            (("data", "object", "customer"), 255),
            (("data", "object", "client_reference_id"), 255),
            (("data", "object", "customer_email"), 254),
            (("data", "object", "customer_details", "email"), 254),
        ]
    ),
    *(
        ("subscription", path, limit)
        for path, limit in [
            (("id",), 255),
            (("data", "object", "id"), 255),
            (("data", "object", "customer"), 255),
            (("data", "object", "status"), 32),
            (("data", "object", "items", "data", 0, "price", "id"), 255),
        ]
    ),
]


def put(target: Any, path: tuple[Any, ...], new: Any) -> None:
    for step in path[:-1]:
        if target[step] is None:  # customer_details may be null
            target[step] = {}
        target = target[step]
    target[path[-1]] = new


@st.composite
def stripe_body(draw: st.DrawFn, alice_id: str, family: str) -> dict[str, Any]:
    if family == CHECKOUT:
        return stripe_events.checkout_completed(
            client_reference_id=alice_id, email="alice@example.com"
        )
    return stripe_events.subscription(draw(st.sampled_from(SUBSCRIPTION_EVENTS)))


@pytest.mark.parametrize(("family", "path", "limit"), TARGETS, ids=str)
def test_no_signed_stripe_body_gets_a_5xx_or_writes_half(
    cast, client, fuzz_settings, family, path, limit
):
    others = [(p, n) for f, p, n in TARGETS if f == family and p != path]
    seen: set[int] = set()

    @fuzz_settings
    @given(
        body=stripe_body(str(cast.alice.id), family),
        new=value(limit),
        noise=st.lists(st.sampled_from(others), unique=True, max_size=2).flatmap(
            lambda picked: st.tuples(*(st.tuples(st.just(p), value(n)) for p, n in picked))
        ),
    )
    def deliver(body: dict[str, Any], new: Any, noise: tuple[Any, ...]) -> None:
        put(body, path, new)
        for other, broken in noise:
            put(body, other, broken)
        seen.add(check_delivery(lambda: stripe_events.deliver(client, body)))

    deliver()
    assert 400 in seen  # the fuzzing reached the refusals


@st.composite
def mcpize_body(draw: st.DrawFn, alice_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "userId": draw(st.one_of(st.just(alice_id), value())),
        "tier": draw(st.one_of(st.sampled_from(["pro", "starter", "free"]), value())),
    }
    if draw(st.booleans()):
        body["eventId"] = draw(value())
    return body


def test_no_signed_mcpize_body_gets_a_5xx_or_writes_half(cast, client, fuzz_settings):
    seen: set[int] = set()

    @fuzz_settings
    @given(body=mcpize_body(str(cast.alice.id)))
    def deliver(body: dict[str, Any]) -> None:
        seen.add(check_delivery(lambda: mcpize_post(client, body)))

    deliver()
    assert {200, 400} <= seen


# The cases the attack found, pinned ----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "bad", "reason"),
    [
        ("status", "s" * 33, "data.object.status must be at most 32 characters"),
        ("status", "act\x00ive", "data.object.status must not contain NUL characters"),
        ("customer", "cus_\x00", "data.object.customer must not contain NUL characters"),
        ("id", "sub_\ud800", "data.object.id must be valid Unicode text"),
    ],
)
def test_a_subscription_event_with_a_string_the_database_refuses_is_a_400(
    cast, client, field, bad, reason
):
    body = stripe_events.subscription()
    body["data"]["object"][field] = bad

    response = stripe_events.deliver(client, body)

    assert response.status_code == 400
    assert response.json()["error"]["message"] == f"Refused: {reason}."
    with tenancy.operator():
        assert not Subscription.objects.exists()
        [rejection] = WebhookRejection.objects.all()
    assert (rejection.source, rejection.event_id, rejection.status) == ("stripe", body["id"], 400)
    assert rejection.reason == reason


def test_a_stripe_event_id_with_a_nul_is_refused_and_recorded_scrubbed(cast, client):
    body = stripe_events.checkout_completed(client_reference_id=str(cast.alice.id))
    body["id"] = "evt_\x00abc"

    response = stripe_events.deliver(client, body)

    assert response.status_code == 400
    with tenancy.operator():
        assert not BillingAccount.objects.exists()
        assert WebhookRejection.objects.get().event_id == "evt_\ufffdabc"


def test_a_checkout_email_with_a_nul_is_refused(cast, client):
    body = stripe_events.checkout_completed(email="alice\x00@example.com")

    response = stripe_events.deliver(client, body)

    assert response.status_code == 400
    assert "customer_details.email" in response.json()["error"]["message"]


def test_an_mcpize_event_id_of_a_nul_is_refused(cast, client):
    response = mcpize_post(client, {"userId": str(cast.alice.id), "tier": "pro", "eventId": "\x00"})

    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "Refused: eventId must not contain NUL characters."
    )
    assert User.objects.get(id=cast.alice.id).tier == "free"
    with tenancy.operator():
        assert WebhookRejection.objects.get().source == "mcpize"


def test_an_mcpize_delivery_for_an_unknown_user_is_recorded(cast, client):
    response = mcpize_post(
        client, {"userId": "00000000-0000-0000-0000-000000000000", "tier": "pro"}
    )

    assert response.status_code == 404
    with tenancy.operator():
        assert WebhookRejection.objects.get().status == 404


def test_json_dumps_keeps_what_the_fuzzer_sends():
    # The bodies above rely on json escaping NUL and lone surrogates, which
    # the server's parser turns back into the same strings.
    assert json.loads(json.dumps({"a": "\x00\ud800"})) == {"a": "\x00\ud800"}


def test_an_operator_sees_the_refusals_in_the_admin(cast, client):
    body = stripe_events.subscription()
    body["data"]["object"]["status"] = "s" * 40
    stripe_events.deliver(client, body)
    admin = User.objects.create_superuser("ops@example.com", "ops-password-1")
    client.force_login(admin)

    page = client.get("/admin/billing/webhookrejection/")

    assert page.status_code == 200
    assert "data.object.status must be at most 32 characters" in page.content.decode()
