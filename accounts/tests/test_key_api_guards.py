"""What every self-service key endpoint does before it does anything: auth and limits."""

from __future__ import annotations

import pytest
from django.utils import timezone

from accounts import ratelimit
from accounts.models import ApiKey
from accounts.tests.api_client import call
from core import tenancy

ENDPOINTS = [("GET", "/api/keys"), ("POST", "/api/keys"), ("DELETE", "/api/keys/{id}")]


@pytest.fixture(autouse=True)
def fresh_state():
    ratelimit.reset_rate_limiter()
    yield
    ratelimit.reset_rate_limiter()


def revoked(cast) -> str:
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.bob_key.key.id).update(revoked_at=timezone.now())
    return cast.bob_key.raw


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize(
    "make_key",
    [
        pytest.param(lambda cast: None, id="missing"),
        pytest.param(lambda cast: "sk-not-ours", id="malformed"),
        pytest.param(lambda cast: "recall_live_" + "A" * 32, id="unknown"),
        pytest.param(revoked, id="revoked"),
    ],
)
def test_a_bad_key_gets_the_same_401(cast, client, method, path, make_key):
    response = call(client, method, path.format(id=cast.alice_key.key.id), make_key(cast))

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith('Bearer realm="recall"')
    assert response.json() == {
        "error": {
            "code": "unauthorized",
            "message": "Missing or invalid API key. Send Authorization: Bearer recall_live_...",
        }
    }


def test_a_non_bearer_scheme_is_refused(cast, client):
    response = client.get("/api/keys", HTTP_AUTHORIZATION=f"Basic {cast.alice_key.raw}")

    assert response.status_code == 401


def test_it_is_rate_limited_like_mcp_with_retry_after(cast, client, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}

    first = call(client, "GET", "/api/keys", cast.alice_key.raw)
    call(client, "GET", "/api/keys", cast.alice_key.raw)
    limited = call(client, "POST", "/api/keys", cast.alice_key.raw)

    assert first.status_code == 200
    assert first["RateLimit-Limit"] == "2"
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert limited["Retry-After"] == "30"  # one token at 2 per minute
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice).count() == 2  # nothing issued
    # The bucket is the key's, shared with its MCP calls, not the user's.
    assert call(client, "GET", "/api/keys", cast.bob_key.raw).status_code == 200


def test_it_shares_the_bucket_the_mcp_endpoint_uses(cast, client, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (1, 60)}
    capacity, refill = ratelimit.limit_for_tier("free")
    ratelimit.get_rate_limiter().check(f"key:{cast.alice_key.key.id}:free", capacity, refill)

    assert call(client, "GET", "/api/keys", cast.alice_key.raw).status_code == 429


def test_a_leaked_key_that_spent_the_shared_allowance_can_still_be_revoked(cast, client, settings):
    # It drained the ceiling every key of its user draws on, and the user's
    # other keys were answered 429 when they tried to revoke it.
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "free": (2, 60)}
    settings.MAX_KEYS_PER_USER = 1
    leaked, other = cast.alice_key, cast.bob_key  # both Alice's
    for _ in range(2):
        call(client, "GET", "/api/keys", leaked.raw)
    assert call(client, "GET", "/api/keys", other.raw).status_code == 429  # the ceiling

    revoked = call(client, "DELETE", f"/api/keys/{leaked.key.id}", other.raw)

    assert revoked.status_code == 200, revoked.json()
    assert call(client, "GET", "/api/keys", leaked.raw).status_code == 401
    # The calling key's own bucket (2: the refused GET took one) still
    # paces a flood of revocations.
    assert call(client, "DELETE", f"/api/keys/{leaked.key.id}", other.raw).status_code == 429


def test_it_needs_no_csrf_token(cast):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)

    assert call(strict, "POST", "/api/keys", cast.alice_key.raw).status_code == 201


def test_errors_are_json(cast, client):
    response = call(client, "PUT", "/api/keys", cast.alice_key.raw)

    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "method_not_allowed"
