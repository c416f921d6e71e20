from __future__ import annotations

import uuid

from django.utils import timezone

from accounts import auth
from accounts.models import ApiKey
from accounts.tests.api_client import call
from core import tenancy


def test_it_revokes_a_key_at_once(cast, client):
    assert auth.authenticate(cast.bob_key.raw) is not None  # cached now

    response = call(client, "DELETE", f"/api/keys/{cast.bob_key.key.id}", cast.alice_key.raw)

    assert response.status_code == 200
    assert response.json() == {"success": True}
    assert auth.authenticate(cast.bob_key.raw) is None
    assert auth.authenticate(cast.alice_key.raw) is not None


def test_a_key_can_revoke_itself(cast, client):
    response = call(client, "DELETE", f"/api/keys/{cast.alice_key.key.id}", cast.alice_key.raw)

    assert response.status_code == 200
    assert call(client, "GET", "/api/keys", cast.alice_key.raw).status_code == 401


def test_revoking_twice_is_harmless(cast, client):
    path = f"/api/keys/{cast.bob_key.key.id}"
    call(client, "DELETE", path, cast.alice_key.raw)

    assert call(client, "DELETE", path, cast.alice_key.raw).status_code == 200


def test_charlie_cannot_revoke_alices_key_and_learns_nothing(cast, client):
    theirs = call(client, "DELETE", f"/api/keys/{cast.alice_key.key.id}", cast.charlie_key.raw)
    missing = call(client, "DELETE", f"/api/keys/{uuid.uuid4()}", cast.charlie_key.raw)

    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert theirs.json()["error"]["code"] == "not_found"
    with tenancy.operator():
        assert ApiKey.objects.get(id=cast.alice_key.key.id).revoked_at is None
    assert auth.authenticate(cast.alice_key.raw) is not None


def test_a_malformed_id_is_not_found(cast, client):
    response = call(client, "DELETE", "/api/keys/not-a-uuid", cast.alice_key.raw)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_only_delete_is_allowed_on_a_key(cast, client):
    response = call(client, "GET", f"/api/keys/{cast.bob_key.key.id}", cast.alice_key.raw)

    assert response.status_code == 405
    assert response["Allow"] == "DELETE"


def test_a_key_revoked_elsewhere_revokes_nothing_while_it_is_cached(cast, client):
    assert auth.authenticate(cast.alice_key.raw) is not None  # cached now
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(revoked_at=timezone.now())

    response = call(client, "DELETE", f"/api/keys/{cast.bob_key.key.id}", cast.alice_key.raw)

    assert response.status_code == 401
    with tenancy.operator():
        assert ApiKey.objects.get(id=cast.bob_key.key.id).revoked_at is None
