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


def _add_form_token(admin_client) -> str:
    page = admin_client.get(f"{URL}add/").content.decode()
    found = re.search(r'name="once" value="([^"]+)"', page)
    assert found is not None
    return found[1]


def _keys_of(user) -> int:
    with tenancy.operator():
        return ApiKey.objects.filter(user=user).count()


def test_reloading_the_new_key_page_issues_no_second_key(cast, admin_client):
    # A reload of the page that showed the key sends the same form again.
    sent = {"user": str(cast.charlie.id), "name": "from ops", "tier": "pro"}
    sent["once"] = _add_form_token(admin_client)
    before = _keys_of(cast.charlie)
    first = admin_client.post(f"{URL}add/", sent)
    raw = re.search(r"recall_live_[A-Za-z0-9_-]{32}", first.content.decode())[0]

    again = admin_client.post(f"{URL}add/", sent, follow=True)

    assert _keys_of(cast.charlie) == before + 1
    text = again.content.decode()
    assert not re.search(r"recall_live_[A-Za-z0-9_-]{32}", text)
    assert "That form was sent before" in text
    assert again.redirect_chain[-1][0] == URL
    assert auth.authenticate(raw) is not None
    # A new add page is a new form: it issues a key.
    fresh = {**sent, "once": _add_form_token(admin_client)}
    assert fresh["once"] != sent["once"]
    assert re.search(r"recall_live_", admin_client.post(f"{URL}add/", fresh).content.decode())
    assert _keys_of(cast.charlie) == before + 2


def test_a_form_sent_back_with_an_error_can_be_corrected_and_sent_again(cast, admin_client):
    once = _add_form_token(admin_client)

    sent = {"user": "", "name": "x", "tier": "pro", "once": once}
    refused = admin_client.post(f"{URL}add/", sent)
    corrected = admin_client.post(
        f"{URL}add/", {"user": str(cast.charlie.id), "name": "x", "tier": "pro", "once": once}
    )

    assert refused.status_code == 200 and "errornote" in refused.content.decode()
    assert re.search(r"recall_live_[A-Za-z0-9_-]{32}", corrected.content.decode())


@pytest.mark.django_db(transaction=True)
def test_one_add_form_sent_several_times_at_once_issues_one_key(cast, admin_client):
    from django.test import Client

    from tests.support import at_once

    once = _add_form_token(admin_client)
    before = _keys_of(cast.charlie)

    def send() -> str:
        client = Client()
        client.cookies = admin_client.cookies
        sent = {"user": str(cast.charlie.id), "name": "twice", "tier": "free", "once": once}
        return client.post(f"{URL}add/", sent).content.decode()

    pages = at_once(4, send)

    assert len(pages) == 4
    assert sum(1 for text in pages if re.search(r"recall_live_[A-Za-z0-9_-]{32}", text)) == 1
    assert _keys_of(cast.charlie) == before + 1
