from __future__ import annotations

import re

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from accounts import auth, keys
from accounts.models import ApiKey
from core import tenancy

URL = "/admin/accounts/apikey/"


def test_adding_a_key_shows_the_secret_once(cast, admin_client):
    response = admin_client.post(
        f"{URL}add/", {"user": str(cast.charlie.id), "name": "from ops", "tier": "pro"}, follow=True
    )

    shown = re.findall(r"recall_live_[A-Za-z0-9_-]{32}", response.content.decode())
    assert len(set(shown)) == 1
    raw = shown[0]
    caller = auth.authenticate(raw)
    assert caller.user_id == cast.charlie.id
    assert caller.tier == "pro"
    with tenancy.operator():
        key = ApiKey.objects.get(id=caller.api_key_id)
    assert key.name == "from ops"
    assert key.key_hash == keys.digest(raw)
    # Never again: not on the next list, not on the key's own page.
    assert raw not in admin_client.get(URL).content.decode()
    assert raw not in admin_client.get(f"{URL}{key.id}/change/").content.decode()


def test_the_secret_is_on_the_answering_page_only_never_a_cookie_or_the_history(cast, admin_client):
    from django.contrib.admin.models import ADDITION, LogEntry

    response = admin_client.post(
        f"{URL}add/", {"user": str(cast.alice.id), "name": "", "tier": "free"}
    )

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    raw = re.search(r"recall_live_[A-Za-z0-9_-]{32}", response.content.decode())[0]
    assert "will not be shown again" in response.content.decode()
    # The default message storage is a cookie: the secret used to ride in one.
    assert not list(get_messages(response.wsgi_request))
    assert all(raw not in morsel.value for morsel in response.cookies.values())
    assert raw not in str(admin_client.session.items())
    entry = LogEntry.objects.get(action_flag=ADDITION)
    assert raw not in entry.object_repr + entry.change_message


def test_the_list_shows_last_used_created_and_revoked(cast, admin_client):
    used = timezone.now()
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(last_used_at=used)
        ApiKey.objects.filter(id=cast.bob_key.key.id).update(revoked_at=used)

    text = admin_client.get(URL).content.decode()

    for column in ("field-last_used_at", "field-created_at", "field-revoked_at"):
        assert column in text
    assert cast.alice_key.key.key_hash not in text


def test_revoking_keys_takes_effect_at_once(cast, admin_client):
    assert auth.authenticate(cast.alice_key.raw) is not None  # cached
    assert auth.authenticate(cast.charlie_key.raw) is not None

    admin_client.post(
        URL,
        {
            "action": "revoke",
            "_selected_action": [str(cast.alice_key.key.id), str(cast.charlie_key.key.id)],
        },
    )

    assert auth.authenticate(cast.alice_key.raw) is None
    assert auth.authenticate(cast.charlie_key.raw) is None
    assert auth.authenticate(cast.bob_key.raw) is not None


def test_changing_the_tier_takes_effect_at_once(cast, admin_client):
    assert auth.authenticate(cast.bob_key.raw).tier == "free"

    admin_client.post(
        URL, {"action": "set_keys_tier_pro", "_selected_action": [str(cast.bob_key.key.id)]}
    )

    assert auth.authenticate(cast.bob_key.raw).tier == "pro"
    assert auth.authenticate(cast.alice_key.raw).tier == "free"


def test_the_change_form_renames_and_retiers_through_the_services(cast, admin_client):
    auth.authenticate(cast.alice_key.raw)

    response = admin_client.post(
        f"{URL}{cast.alice_key.key.id}/change/", {"name": "renamed", "tier": "starter"}
    )

    assert response.status_code == 302
    with tenancy.operator():
        key = ApiKey.objects.get(id=cast.alice_key.key.id)
    assert (key.name, key.tier) == ("renamed", "starter")
    assert auth.authenticate(cast.alice_key.raw).tier == "starter"


def test_bulk_delete_is_not_offered(cast, admin_client):
    response = admin_client.get(URL)

    assert "delete_selected" not in response.content.decode()


def test_it_filters_live_and_revoked_keys(cast, admin_client):
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.bob_key.key.id).update(revoked_at=timezone.now())

    live = admin_client.get(URL, {"status": "live"}).content.decode()
    revoked = admin_client.get(URL, {"status": "revoked"}).content.decode()

    assert cast.bob_key.key.prefix not in live
    assert cast.alice_key.key.prefix in live
    assert cast.bob_key.key.prefix in revoked
    assert cast.alice_key.key.prefix not in revoked


@pytest.mark.django_db(transaction=True)
def test_a_key_deleted_in_the_admin_stops_at_once(cast, admin_client):
    assert auth.authenticate(cast.alice_key.raw) is not None  # cached now

    response = admin_client.post(f"{URL}{cast.alice_key.key.id}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert auth.authenticate(cast.alice_key.raw) is None
