from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts import auth
from accounts import services as accounts_services
from accounts.models import ApiKey
from core import tenancy
from tests.support import at_once

URL = "/keys/"
SECRET = re.compile(r"recall_live_[A-Za-z0-9_-]{32}")


def test_it_lists_the_users_keys_with_last_used(cast, alice_client):
    text = alice_client.get(URL).content.decode()

    assert cast.alice_key.key.prefix in text
    assert cast.bob_key.key.prefix in text
    assert cast.charlie_key.key.prefix not in text
    assert "never" in text  # last used
    assert not SECRET.search(text)


def test_a_key_used_in_the_last_minute_says_so(cast, alice_client):
    moments = {
        cast.alice_key.key.id: timezone.now() - timedelta(seconds=5),
        cast.bob_key.key.id: timezone.now() - timedelta(hours=3),
    }
    accounts_services.record_key_use(moments)

    text = alice_client.get(URL).content.decode()

    assert "within the last minute" in text
    assert "3\xa0hours ago" in text
    assert "0\xa0minutes" not in text and "never" not in text


def test_a_new_key_is_shown_once_and_works(cast, alice_client):
    response = alice_client.post(URL, {"name": "laptop", "tier": "free"})

    raw = SECRET.search(response.content.decode())[0]
    assert response["Cache-Control"] == "no-store"
    assert "will not be shown again" in response.content.decode()
    caller = auth.authenticate(raw)
    assert caller.user_id == cast.alice.id
    assert raw not in alice_client.get(URL).content.decode()
    # The snippet under it is ready to paste.
    assert f"Bearer {raw}" in response.content.decode()


def test_sending_the_form_again_creates_no_second_key(cast, alice_client):
    # A reload of the page that showed the new key sends its form again.
    page = alice_client.get(URL).content.decode()
    once = re.search(r'name="once" value="([^"]+)"', page)[1]
    sent = {"name": "laptop", "tier": "free", "once": once}
    before = accounts_services.list_own_keys(user_id=cast.alice.id)

    first = alice_client.post(URL, sent)
    again = alice_client.post(URL, sent, follow=True)

    assert SECRET.search(first.content.decode())
    assert not SECRET.search(again.content.decode())
    assert "sent before" in again.content.decode()
    after = accounts_services.list_own_keys(user_id=cast.alice.id)
    assert len(after) == len(before) + 1
    # The page after a key carries a fresh form: a second key is one click.
    fresh = re.search(r'name="once" value="([^"]+)"', first.content.decode())[1]
    assert fresh != once
    assert SECRET.search(alice_client.post(URL, {**sent, "once": fresh}).content.decode())


@pytest.mark.django_db(transaction=True)
def test_one_form_sent_several_times_at_once_creates_one_key(cast, alice_client):
    # A double click: the sends overlap, and each read the session as it was
    # before any of them, found the form unsent and made a key.
    page = alice_client.get(URL).content.decode()
    once = re.search(r'name="once" value="([^"]+)"', page)[1]
    before = len(accounts_services.list_own_keys(user_id=cast.alice.id))

    def send() -> str:
        client = Client()
        client.cookies = alice_client.cookies
        return client.post(URL, {"name": "laptop", "tier": "free", "once": once}).content.decode()

    pages = at_once(5, send)

    assert len(pages) == 5
    assert sum(1 for text in pages if SECRET.search(text)) == 1
    assert len(accounts_services.list_own_keys(user_id=cast.alice.id)) == before + 1


def test_a_key_can_act_as_one_of_the_users_agents(cast, agents, alice_client):
    page = alice_client.get(URL).content.decode()
    assert "Agent: research" in page and "Agent: helper" not in page

    response = alice_client.post(
        URL, {"name": "bot", "tier": "free", "agent": str(agents.research.id)}
    )

    raw = SECRET.search(response.content.decode())[0]
    assert auth.authenticate(raw).agent_id == agents.research.id
    row = re.search(r"data-key-agent>([^<]*)<", alice_client.get(URL).content.decode())
    assert row is not None and row[1] == "research"


def test_another_users_agent_is_not_a_choice(cast, agents, alice_client):
    response = alice_client.post(
        URL, {"name": "bot", "tier": "free", "agent": str(agents.helper.id)}
    )

    assert not SECRET.search(response.content.decode())
    assert "Select a valid choice" in response.content.decode()


def test_the_tier_cannot_be_above_the_users(cast, alice_client):
    response = alice_client.post(URL, {"name": "greedy", "tier": "team"})

    assert not SECRET.search(response.content.decode())
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice).count() == 2
    assert 'value="team"' not in alice_client.get(URL).content.decode()


def test_a_pro_user_may_create_lower_tiers(cast, alice_client):
    type(cast.alice).objects.filter(id=cast.alice.id).update(tier="pro")

    response = alice_client.post(URL, {"name": "cheap", "tier": "starter"})

    assert auth.authenticate(SECRET.search(response.content.decode())[0]).tier == "starter"


def test_the_key_cap_is_explained(cast, alice_client, settings):
    settings.MAX_KEYS_PER_USER = 2

    response = alice_client.post(URL, {"name": "third", "tier": "free"})

    assert not SECRET.search(response.content.decode())
    assert "the most allowed" in response.content.decode()


def test_revoking_takes_effect_at_once(cast, alice_client):
    assert auth.authenticate(cast.bob_key.raw) is not None

    response = alice_client.post(f"/keys/{cast.bob_key.key.id}/revoke/")

    assert response.status_code == 302
    assert auth.authenticate(cast.bob_key.raw) is None
    assert "revoked" in alice_client.get(URL).content.decode()


def test_charlie_cannot_revoke_alices_key(cast, charlie_client):
    response = charlie_client.post(f"/keys/{cast.alice_key.key.id}/revoke/")

    assert response.status_code == 404
    assert auth.authenticate(cast.alice_key.raw) is not None


def test_revoking_needs_post(cast, alice_client):
    assert alice_client.get(f"/keys/{cast.bob_key.key.id}/revoke/").status_code == 405


@pytest.mark.parametrize(
    ("path", "data"),
    [(URL, {"name": "x", "tier": "free"}), ("/keys/{bob}/revoke/", {})],
)
def test_forms_are_csrf_protected(cast, path, data):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(cast.alice)

    response = strict.post(path.format(bob=cast.bob_key.key.id), data)

    assert response.status_code == 403
    with tenancy.operator():
        assert ApiKey.objects.filter(user=cast.alice, revoked_at__isnull=True).count() == 2


def test_a_form_whose_send_made_no_key_may_be_sent_again(cast, alice_client, monkeypatch):
    # Marked as sent before the key was made, a send that failed left the form
    # "sent before, its key is listed below" with no key to list.
    page = alice_client.get(URL).content.decode()
    once = re.search(r'name="once" value="([^"]+)"', page)[1]
    sent = {"name": "laptop", "tier": "free", "once": once}
    real = accounts_services.issue_own_key

    def failing(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(accounts_services, "issue_own_key", failing)
    with pytest.raises(RuntimeError):
        alice_client.post(URL, sent)
    monkeypatch.setattr(accounts_services, "issue_own_key", real)

    again = alice_client.post(URL, sent)

    assert SECRET.search(again.content.decode())
