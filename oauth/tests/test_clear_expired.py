"""What the maintenance thread clears from the OAuth tables, and what it must keep.

Codes and tokens no request can use any more are deleted; a token a later
request still needs stays: the access token a live refresh token holds (the
toolkit refuses a refresh token whose access token is gone), a spent code
until it expires (its second use revokes what the first issued), and a
revoked refresh token for a refresh token's lifetime (its replay revokes its
family).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from core import housekeeping
from oauth import services
from oauth.models import AccessToken, Grant, RefreshToken
from oauth.tests.test_consent_page import PUBLIC
from oauth.tests.test_consent_skipped import connect
from tests.consent import register


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.RECALL_PUBLIC_URL = PUBLIC


@pytest.fixture
def alice_client(cast) -> Client:
    browser = Client()
    browser.force_login(cast.alice)
    return browser


def counts() -> tuple[int, int, int]:
    # The client's registration token (RFC 7592) never expires: it acts as no agent.
    connection = AccessToken.objects.exclude(agent=None)
    return Grant.objects.count(), connection.count(), RefreshToken.objects.count()


def test_a_connections_tokens_stay_while_its_refresh_token_lives(cast, alice_client, settings):
    connect(alice_client, register(alice_client), "desk")
    now = timezone.now()
    life = timedelta(seconds=settings.OAUTH_REFRESH_TOKEN_TTL_SECONDS)
    assert counts() == (1, 1, 1)

    assert services.clear_expired(now=now) == {"codes": 0, "refresh_tokens": 0, "access_tokens": 0}
    # The code has expired; the access token too, but its refresh token still needs it.
    later = services.clear_expired(now=now + timedelta(hours=2))
    assert later == {"codes": 1, "refresh_tokens": 0, "access_tokens": 0}
    assert counts() == (0, 1, 1)
    # Unused for a refresh token's lifetime: both go.
    idle = services.clear_expired(now=now + life + timedelta(hours=2))
    assert idle == {"codes": 0, "refresh_tokens": 1, "access_tokens": 1}
    assert counts() == (0, 0, 0)


def test_a_revoked_refresh_token_is_kept_for_its_lifetime(cast, alice_client, settings):
    client_id = register(alice_client)
    connect(alice_client, client_id, "desk")
    refresh = RefreshToken.objects.get()
    RefreshToken.revoke_family(refresh.token_family)
    now = timezone.now()
    life = timedelta(seconds=settings.OAUTH_REFRESH_TOKEN_TTL_SECONDS)

    assert services.clear_expired(now=now + life - timedelta(minutes=1))["refresh_tokens"] == 0
    assert RefreshToken.objects.filter(revoked__isnull=False).count() == 1
    assert services.clear_expired(now=now + life + timedelta(minutes=1))["refresh_tokens"] == 1


def test_the_maintenance_pass_runs_the_oauth_clean_up(cast, alice_client):
    connect(alice_client, register(alice_client), "desk")
    Grant.objects.update(expires=timezone.now() - timedelta(seconds=1))

    done = housekeeping.run()

    assert done is not None and done["oauth"]["codes"] == 1
    assert not Grant.objects.exists()


def test_a_refresh_token_whose_access_token_was_revoked_alone_goes_at_once(cast, alice_client):
    # RFC 7009 revocation of the access token leaves its refresh token with none:
    # refused by the toolkit, never a replay to catch, and it stayed for ever.
    connect(alice_client, register(alice_client), "desk")
    AccessToken.objects.exclude(agent=None).delete()

    assert services.clear_expired()["refresh_tokens"] == 1
    assert not RefreshToken.objects.exists()
