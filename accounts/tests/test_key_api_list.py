from __future__ import annotations

from accounts.tests.api_client import call


def test_it_lists_the_callers_keys_without_secrets(cast, client):
    response = call(client, "GET", "/api/keys", cast.bob_key.raw)

    assert response.status_code == 200
    listed = response.json()["keys"]
    assert {k["id"] for k in listed} == {str(cast.alice_key.key.id), str(cast.bob_key.key.id)}
    assert set(listed[0]) == {
        "id",
        "name",
        "prefix",
        "tier",
        "agent_id",
        "created_at",
        "last_used_at",
        "revoked_at",
    }
    text = response.content.decode()
    for raw in (cast.alice_key.raw, cast.bob_key.raw):
        assert raw not in text
    assert cast.alice_key.key.key_hash not in text


def test_charlie_never_sees_alices_keys(cast, client):
    response = call(client, "GET", "/api/keys", cast.charlie_key.raw)

    assert [k["id"] for k in response.json()["keys"]] == [str(cast.charlie_key.key.id)]
    assert cast.alice_key.key.prefix not in response.content.decode()


def test_revoked_keys_are_listed_after_live_ones(cast, client):
    call(client, "DELETE", f"/api/keys/{cast.alice_key.key.id}", cast.bob_key.raw)

    listed = call(client, "GET", "/api/keys", cast.bob_key.raw).json()["keys"]

    assert [k["id"] for k in listed] == [str(cast.bob_key.key.id), str(cast.alice_key.key.id)]
    assert listed[0]["revoked_at"] is None
    assert listed[1]["revoked_at"] is not None
