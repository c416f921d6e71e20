from __future__ import annotations

import pytest
from django.utils import timezone

from accounts import auth, keys
from accounts.models import ApiKey, User
from accounts.tests.api_client import call
from conftest import issue_key
from core import tenancy


def test_it_returns_a_new_key_once(cast, client):
    response = call(client, "POST", "/api/keys", cast.alice_key.raw, {"name": "ci"})

    assert response.status_code == 201
    body = response.json()
    assert keys.is_well_formed(body["key"])
    assert body["name"] == "ci"
    assert body["tier"] == "free"
    assert body["prefix"] == body["key"][: keys.DISPLAY_LENGTH]
    assert response["Cache-Control"] == "no-store"
    # The new key works, belongs to Alice, and is stored only as a hash.
    assert auth.authenticate(body["key"]).user_id == cast.alice.id
    with tenancy.operator():
        stored = ApiKey.objects.get(id=body["id"])
    assert body["key"] not in (stored.key_hash, stored.prefix)
    listed = call(client, "GET", "/api/keys", cast.alice_key.raw).content.decode()
    assert body["key"] not in listed


def test_a_body_is_optional(cast, client):
    response = call(client, "POST", "/api/keys", cast.alice_key.raw)

    assert response.status_code == 201
    assert response.json()["name"] == ""


def test_it_issues_a_lower_tier_than_its_own(cast, client):
    pro = issue_key(cast.alice, "pro key", tier="pro")

    response = call(client, "POST", "/api/keys", pro.raw, {"tier": "starter"})

    assert response.status_code == 201
    assert response.json()["tier"] == "starter"


def test_the_default_tier_is_the_calling_keys(cast, client):
    team = issue_key(cast.alice, "team key", tier="team")

    response = call(client, "POST", "/api/keys", team.raw, {})

    assert response.json()["tier"] == "team"


def test_a_key_cannot_issue_a_higher_tier_than_its_own(cast, client):
    response = call(client, "POST", "/api/keys", cast.alice_key.raw, {"tier": "pro"})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_failed"
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice).count() == 2


def test_the_number_of_live_keys_is_capped(cast, client, settings):
    settings.MAX_KEYS_PER_USER = 3  # Alice holds two already
    assert call(client, "POST", "/api/keys", cast.alice_key.raw).status_code == 201

    refused = call(client, "POST", "/api/keys", cast.alice_key.raw)

    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "quota_exceeded"
    # Revoked keys do not count.
    call(client, "DELETE", f"/api/keys/{cast.bob_key.key.id}", cast.alice_key.raw)
    assert call(client, "POST", "/api/keys", cast.alice_key.raw).status_code == 201


def test_the_cap_is_per_user(cast, client, settings):
    settings.MAX_KEYS_PER_USER = 2  # Alice is at the cap, Charlie is not

    assert call(client, "POST", "/api/keys", cast.alice_key.raw).status_code == 403
    assert call(client, "POST", "/api/keys", cast.charlie_key.raw).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        '{"name": ',
        "[1, 2]",
        '"ci"',
        {"name": 7},
        {"name": "x" * 101},
        {"tier": "platinum"},
        {"owner": "charlie"},
    ],
    ids=["bad-json", "array", "string", "name-type", "name-length", "tier", "unknown-field"],
)
def test_bad_input_is_a_validation_error_and_issues_nothing(cast, client, body):
    response = call(client, "POST", "/api/keys", cast.alice_key.raw, body)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_failed"
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice).count() == 2


def test_the_new_key_belongs_to_the_caller_whatever_the_body_says(cast, client):
    response = call(client, "POST", "/api/keys", cast.charlie_key.raw, {"name": "mine"})

    with tenancy.operator():
        assert ApiKey.objects.get(id=response.json()["id"]).user_id == cast.charlie.id


@pytest.mark.parametrize(
    "body",
    ['{"name": ' + "[" * 979 + "]" * 979 + "}", "[" * 979 + "]" * 979],
    ids=["nested name", "nested body"],
)
def test_it_refuses_a_deeply_nested_body_as_not_json(cast, client, body):
    response = call(client, "POST", "/api/keys", cast.alice_key.raw, body)

    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "validation_failed",
        "message": "The request body must be JSON.",
    }
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice).count() == 2


def test_a_user_wide_key_issues_a_key_scoped_to_one_of_its_agents(cast, agents, client):
    response = call(
        client, "POST", "/api/keys", cast.alice_key.raw, {"agent_id": str(agents.research.id)}
    )

    assert response.status_code == 201
    assert response.json()["agent_id"] == str(agents.research.id)
    assert auth.authenticate(response.json()["key"]).agent_id == agents.research.id


def test_a_key_cannot_be_scoped_to_another_users_agent(cast, agents, client):
    response = call(
        client, "POST", "/api/keys", cast.alice_key.raw, {"agent_id": str(agents.helper.id)}
    )

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_an_agents_key_issues_keys_for_that_agent_only(cast, agents, client):
    with tenancy.operator():
        _, research_raw = ApiKey.objects.issue(user=cast.alice, agent=agents.research)

    sibling = call(client, "POST", "/api/keys", research_raw, {"agent_id": str(agents.writer.id)})
    own = call(client, "POST", "/api/keys", research_raw, {"name": "sub"})

    assert sibling.status_code == 400
    assert own.status_code == 201
    assert own.json()["agent_id"] == str(agents.research.id)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ci\x00", "name must not contain NUL characters."),
        ("ci\ud800", "name must be valid Unicode text."),
        ("k" * 101, "name must be at most 100 characters."),
        (7, "name must be a string."),
    ],
)
def test_a_name_the_database_cannot_store_is_refused_before_anything_is_written(
    cast, client, name, message
):
    with tenancy.operator():
        before = ApiKey.objects.count()

    response = call(client, "POST", "/api/keys", cast.alice_key.raw, {"name": name})

    assert response.status_code == 400
    assert response.json()["error"]["message"] == message
    with tenancy.operator():
        assert ApiKey.objects.count() == before


def behind_the_cache(key_id, **change) -> None:
    """Change a key as another server does: its row, not this process's auth cache."""
    with tenancy.operator():
        ApiKey.objects.filter(id=key_id).update(**change)


def test_a_key_revoked_elsewhere_mints_nothing_while_it_is_cached(cast, client):
    pro = issue_key(cast.alice, "pro key", tier="pro")
    assert auth.authenticate(pro.raw).tier == "pro"  # cached now
    behind_the_cache(pro.key.id, revoked_at=timezone.now())

    response = call(client, "POST", "/api/keys", pro.raw, {"name": "after revoke"})

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    with tenancy.operator():
        assert not ApiKey.objects.filter(name="after revoke").exists()


def test_a_key_lowered_elsewhere_mints_at_its_tier_now_not_the_cached_one(cast, client):
    pro = issue_key(cast.alice, "pro key", tier="pro")
    assert auth.authenticate(pro.raw).tier == "pro"
    behind_the_cache(pro.key.id, tier="free")

    default = call(client, "POST", "/api/keys", pro.raw, {"name": "default"})
    asked = call(client, "POST", "/api/keys", pro.raw, {"name": "asked", "tier": "pro"})

    assert (default.status_code, default.json()["tier"]) == (201, "free")
    assert asked.status_code == 400
    assert "free" in asked.json()["error"]["message"]


def test_a_user_deactivated_elsewhere_mints_nothing_with_a_cached_key(cast, client):
    assert auth.authenticate(cast.alice_key.raw) is not None
    User.objects.filter(id=cast.alice.id).update(is_active=False)

    response = call(client, "POST", "/api/keys", cast.alice_key.raw, {"name": "inactive"})

    assert response.status_code == 401
