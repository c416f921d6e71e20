from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import uuid

import pytest

from accounts import auth
from accounts.models import ApiKey, User
from billing.models import WebhookEvent, WebhookRejection
from core import tenancy

SECRET = "mcpize-test-secret"
URL = "/webhooks/mcpize/subscription"


@pytest.fixture(autouse=True)
def mcpize_settings(settings):
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = SECRET


def sign(body: bytes, timestamp: str | None = None, secret: str = SECRET) -> str:
    # Written out here rather than imported, so the test pins the documented scheme.
    signed = f"{timestamp}.".encode() + body if timestamp else body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def post(client, payload, *, signature=None, timestamp=None, headers=None, raw=None):
    body = raw if raw is not None else json.dumps(payload).encode()
    extra = {
        "HTTP_X_MCPIZE_SIGNATURE": signature if signature is not None else sign(body, timestamp)
    }
    if timestamp is not None:
        extra["HTTP_X_MCPIZE_TIMESTAMP"] = timestamp
    for name, value in (headers or {}).items():
        extra["HTTP_" + name.upper().replace("-", "_")] = value
    return client.post(URL, body, content_type="application/json", **extra)


def tier_of(user: User) -> str:
    return User.objects.get(id=user.id).tier


def test_a_signed_delivery_sets_the_tier_of_the_user_and_every_key(cast, client):
    response = post(client, {"userId": str(cast.alice.id), "tier": "pro"})

    assert response.status_code == 200
    assert response.json() == {"success": True, "duplicate": False, "outcome": "applied"}
    assert tier_of(cast.alice) == "pro"
    with tenancy.operator():
        assert set(ApiKey.objects.filter(user=cast.alice).values_list("tier", flat=True)) == {"pro"}
    assert tier_of(cast.charlie) == "free"


def test_the_new_tier_reaches_cached_keys_at_once(cast, client):
    assert auth.authenticate(cast.bob_key.raw).tier == "free"

    post(client, {"userId": str(cast.alice.id), "tier": "team"})

    assert auth.authenticate(cast.bob_key.raw).tier == "team"


def test_a_timestamped_delivery_signs_the_timestamp_too(cast, client):
    now = str(int(time.time()))
    body = json.dumps({"userId": str(cast.alice.id), "tier": "starter"}).encode()

    unsigned_timestamp = post(client, None, raw=body, timestamp=now, signature=sign(body))
    assert unsigned_timestamp.status_code == 401

    response = post(client, None, raw=body, timestamp=now)
    assert response.status_code == 200
    assert tier_of(cast.alice) == "starter"


# Whole seconds past the five minutes, with room for the truncated clock and
# a slow request: at -301 a delivery stamped 0.9 s into a second and answered
# 0.2 s later was 299.9 s ahead, and accepted.
@pytest.mark.parametrize("age", [330, -330])
def test_a_delivery_outside_five_minutes_is_refused(cast, client, age):
    then = str(int(time.time()) - age)

    response = post(client, {"userId": str(cast.alice.id), "tier": "pro"}, timestamp=then)

    assert response.status_code == 401
    assert tier_of(cast.alice) == "free"


def test_a_replayed_timestamped_delivery_does_nothing(cast, client):
    now = str(int(time.time()))
    body = json.dumps({"userId": str(cast.alice.id), "tier": "pro"}).encode()
    post(client, None, raw=body, timestamp=now)
    User.objects.filter(id=cast.alice.id).update(tier="free")  # changed since, by someone else

    replay = post(client, None, raw=body, timestamp=now)

    assert replay.status_code == 200
    assert replay.json()["duplicate"] is True
    assert tier_of(cast.alice) == "free"


def test_an_idempotency_key_is_handled_once(cast, client):
    headers = {"Idempotency-Key": "delivery-42"}
    post(client, {"userId": str(cast.alice.id), "tier": "pro"}, headers=headers)
    User.objects.filter(id=cast.alice.id).update(tier="free")

    again = post(client, {"userId": str(cast.alice.id), "tier": "pro"}, headers=headers)

    assert again.json()["duplicate"] is True
    assert tier_of(cast.alice) == "free"
    assert WebhookEvent.objects.filter(source="mcpize", event_id="delivery-42").count() == 1


def test_a_replay_with_a_fresh_idempotency_key_is_known_by_its_signature(cast, client):
    # The header is not signed: anyone holding a captured delivery can add one.
    now = int(time.time())
    pro = json.dumps({"userId": str(cast.alice.id), "tier": "pro"}).encode()
    post(client, None, raw=pro, timestamp=str(now))
    post(client, {"userId": str(cast.alice.id), "tier": "free"}, timestamp=str(now + 1))

    replay = post(client, None, raw=pro, timestamp=str(now), headers={"Idempotency-Key": "zz"})

    assert replay.status_code == 200
    assert replay.json() == {"success": True, "duplicate": True, "outcome": "duplicate"}
    assert tier_of(cast.alice) == "free"
    assert not WebhookEvent.objects.filter(source="mcpize", event_id="zz").exists()


def test_a_replay_with_a_fresh_idempotency_key_is_known_by_its_signed_event_id(cast, client):
    # Untimestamped, the header replaced the signed eventId as the delivery's
    # name: a captured "pro" replayed with any new header applied again.
    pro = json.dumps({"userId": str(cast.alice.id), "tier": "pro", "eventId": "e-1"}).encode()
    post(client, None, raw=pro)
    post(client, {"userId": str(cast.alice.id), "tier": "free", "eventId": "e-2"})

    replay = post(client, None, raw=pro, headers={"Idempotency-Key": "attacker-123"})

    assert replay.json()["outcome"] == "duplicate"
    assert tier_of(cast.alice) == "free"


def test_a_timestamped_delivery_with_a_key_is_known_by_both(cast, client):
    now = int(time.time())
    pro = {"userId": str(cast.alice.id), "tier": "pro"}
    headers = {"Idempotency-Key": "delivery-7"}
    post(client, pro, timestamp=str(now), headers=headers)
    User.objects.filter(id=cast.alice.id).update(tier="free")

    # MCPize's own retry, signed again a second later: a new signature, the same key.
    retry = post(client, pro, timestamp=str(now + 1), headers=headers)

    assert retry.json()["outcome"] == "duplicate"
    assert tier_of(cast.alice) == "free"


def test_a_delivery_signed_before_the_last_one_applied_is_stale(cast, client):
    now = int(time.time())
    post(client, {"userId": str(cast.alice.id), "tier": "free"}, timestamp=str(now))

    late = post(client, {"userId": str(cast.alice.id), "tier": "team"}, timestamp=str(now - 1))

    assert late.status_code == 200
    assert late.json() == {"success": True, "duplicate": False, "outcome": "stale"}
    assert tier_of(cast.alice) == "free"
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice, tier="team").count() == 0
    # Claimed all the same, like a stale Stripe event: sent again, it is a duplicate.
    again = post(client, {"userId": str(cast.alice.id), "tier": "team"}, timestamp=str(now - 1))
    assert again.json()["outcome"] == "duplicate"


def test_the_order_is_kept_per_user(cast, client):
    now = int(time.time())
    post(client, {"userId": str(cast.alice.id), "tier": "pro"}, timestamp=str(now))

    team = {"userId": str(cast.charlie.id), "tier": "team"}
    charlies = post(client, team, timestamp=str(now - 1))

    assert charlies.json()["outcome"] == "applied"
    assert (tier_of(cast.alice), tier_of(cast.charlie)) == ("pro", "team")


def test_deliveries_signed_in_the_same_second_apply_in_arrival_order(cast, client):
    now = str(int(time.time()))
    post(client, {"userId": str(cast.alice.id), "tier": "pro"}, timestamp=now)

    second = post(client, {"userId": str(cast.alice.id), "tier": "starter"}, timestamp=now)

    assert second.json()["outcome"] == "applied"
    assert tier_of(cast.alice) == "starter"


def test_an_untimestamped_delivery_is_applied_and_does_not_move_the_order(cast, client):
    now = int(time.time())
    post(client, {"userId": str(cast.alice.id), "tier": "pro"}, timestamp=str(now))

    unordered = post(client, {"userId": str(cast.alice.id), "tier": "starter"})
    late = post(client, {"userId": str(cast.alice.id), "tier": "team"}, timestamp=str(now - 1))

    assert unordered.json()["outcome"] == "applied"
    assert late.json()["outcome"] == "stale"
    assert tier_of(cast.alice) == "starter"


def test_an_untimestamped_repeat_of_the_same_body_is_applied(cast, client):
    # pro, then free, then pro again: the third body equals the first, legitimately.
    post(client, {"userId": str(cast.alice.id), "tier": "pro"})
    post(client, {"userId": str(cast.alice.id), "tier": "free"})
    post(client, {"userId": str(cast.alice.id), "tier": "pro"})

    assert tier_of(cast.alice) == "pro"


def test_it_can_require_a_timestamp(cast, client, settings):
    settings.MCPIZE_REQUIRE_TIMESTAMP = True

    response = post(client, {"userId": str(cast.alice.id), "tier": "pro"})

    assert response.status_code == 401
    assert tier_of(cast.alice) == "free"


@pytest.mark.parametrize(
    "signature",
    ["", "0" * 64, "not hex at all", "é" * 64],
    ids=["missing", "zeros", "garbage", "non-ascii"],
)
def test_a_bad_signature_is_refused_and_changes_nothing(cast, client, signature):
    response = post(client, {"userId": str(cast.alice.id), "tier": "pro"}, signature=signature)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert tier_of(cast.alice) == "free"


def test_a_signature_under_another_secret_is_refused(cast, client):
    body = json.dumps({"userId": str(cast.alice.id), "tier": "pro"}).encode()

    response = post(client, None, raw=body, signature=sign(body, secret="guess"))

    assert response.status_code == 401


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"userId": "ALICE", "tier": "pro"}, 400),
        ({"tier": "pro"}, 400),
        ({"userId": "00000000-0000-0000-0000-000000000000", "tier": "pro"}, 404),
        (["not", "an", "object"], 400),
    ],
)
def test_it_validates_the_user_id(cast, client, payload, status):
    response = post(client, payload)

    assert response.status_code == status
    assert "error" in response.json()


@pytest.mark.parametrize("tier", ["platinum", "", None, 3])
def test_it_validates_the_tier(cast, client, tier):
    response = post(client, {"userId": str(cast.alice.id), "tier": tier})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_failed"
    assert tier_of(cast.alice) == "free"


def test_a_body_that_is_not_json_is_refused(cast, client):
    response = post(client, None, raw=b"userId=1&tier=pro")

    assert response.status_code == 400


def test_without_a_secret_it_answers_404_and_logs_why(cast, client, settings, caplog):
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = ""
    with caplog.at_level(logging.WARNING, logger="billing"):
        response = post(client, {"userId": str(cast.alice.id), "tier": "pro"})

    assert response.status_code == 404
    assert any(
        getattr(r, "missing", None) == "MCPIZE_BILLING_WEBHOOK_SECRET" for r in caplog.records
    )
    assert tier_of(cast.alice) == "free"


@pytest.mark.parametrize("timestamp", ["²", "١٢٣", "12 ", "-5", "1e9", ""])
def test_a_timestamp_that_is_not_ascii_digits_is_refused(cast, client, timestamp):
    response = post(client, {"userId": str(cast.alice.id), "tier": "pro"}, timestamp=timestamp)

    assert response.status_code == 401
    assert tier_of(cast.alice) == "free"


def test_a_deeply_nested_signed_body_is_refused_as_nested_too_deeply(cast, client):
    response = post(client, None, raw=b"[" * 979 + b"]" * 979)

    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "validation_failed",
        "message": "Refused: the body is nested more than 100 deep.",
    }


def test_an_oversized_body_is_refused_without_an_error_log(client, caplog, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    with caplog.at_level(logging.DEBUG):
        response = post(client, {"padding": "x" * 4096})

    assert response.status_code == 413
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_it_cannot_grant_the_unlimited_tier(cast, client):
    response = post(client, {"userId": str(cast.alice.id), "tier": "unlimited"})

    assert response.status_code == 400
    # Worded as the webhook's own refusals, not as the service said it.
    assert response.json()["error"] == {
        "code": "validation_failed",
        "message": "Refused: tier must be one of free, starter, pro, team.",
    }
    assert tier_of(cast.alice) == "free"


@pytest.mark.parametrize(
    ("user_id", "status", "code", "message"),
    [
        ("42", 400, "validation_failed", "Refused: userId must be a Recall user id (a UUID)."),
        (str(uuid.UUID(int=7)), 404, "not_found", "Refused: no user has this userId."),
    ],
)
def test_a_delivery_for_no_user_we_know_is_refused_in_the_webhooks_words(
    cast, client, user_id, status, code, message
):
    response = post(client, {"userId": user_id, "tier": "pro"})

    assert response.status_code == status
    assert response.json()["error"] == {"code": code, "message": message}
    assert WebhookRejection.objects.get().status == status


def test_it_leaves_a_tier_the_operator_granted_alone(cast, client, caplog):
    User.objects.filter(id=cast.alice.id).update(tier="unlimited")

    with caplog.at_level(logging.INFO, logger="billing.services"):
        response = post(client, {"userId": str(cast.alice.id), "tier": "starter"})

    assert response.status_code == 200
    assert tier_of(cast.alice) == "unlimited"
    assert "tier left alone: granted by an operator" in caplog.text


@pytest.mark.django_db
@pytest.mark.parametrize("source", ["mcpize", "stripe"])
def test_a_failure_of_ours_is_answered_as_it_is_and_a_refusal_keeps_its_details(source):
    """A 503 is for the sender to retry, not "Refused: ..."; a refusal's details stay."""
    from billing import webhooks
    from core.errors import Unavailable, ValidationFailed

    busy = webhooks._failed(source, Unavailable("Busy right now. Retry in 2 s."), event_id="e1")
    bad = webhooks._failed(
        source, ValidationFailed("tier must be one of free.", field="tier"), event_id="e2"
    )

    assert busy.status_code == 503
    assert json.loads(busy.content) == {
        "error": {"code": "unavailable", "message": "Busy right now. Retry in 2 s."}
    }
    assert bad.status_code == 400
    assert json.loads(bad.content) == {
        "error": {
            "code": "validation_failed",
            "message": "Refused: tier must be one of free.",
            "details": {"field": "tier"},
        }
    }
    assert WebhookRejection.objects.filter(source=source).count() == 2
