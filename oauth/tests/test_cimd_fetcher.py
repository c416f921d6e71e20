"""The metadata-document fetcher refuses what it must, before connecting where it must not.

The fetcher is django-oauth-toolkit's; these tests hold it to what Recall
relies on. Refusals of private addresses need no server: the fetcher decides
from the URL and DNS alone, so these tests send no packet anywhere.
Redirects, sizes, stalls, certificates and content types are checked against
a real https host on loopback, reachable only with the development setting
on, which lifts the address rule and nothing else.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlencode

import pytest
from oauth2_provider.cimd import CIMDError

from oauth import cimd
from tests.oauth_servers import Callback, MetadataHost


@pytest.fixture
def no_connections(monkeypatch):
    """Fail the test if anything tries to open a TCP connection."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fetcher tried to connect")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/client.json",
        "https://10.1.2.3/client.json",
        "https://192.168.0.10/client.json",
        "https://172.16.5.4/client.json",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/client.json",
        "https://[::1]/client.json",
        "https://[::ffff:10.0.0.1]/client.json",
        "https://[fd00::1]/client.json",
        "https://localhost/client.json",
    ],
)
def test_it_refuses_private_and_loopback_addresses_without_connecting(
    url, settings, no_connections
):
    settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = False
    with pytest.raises(CIMDError, match="non-public address"):
        cimd.MetadataFetcher().fetch(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://example.com/client.json", "https"),
        ("https://example.com", "path"),
        ("https://user:pw@example.com/client.json", "userinfo"),
        ("https://example.com/client.json#x", "fragment"),
        ("https://example.com/a/../client.json", "dot path segments"),
    ],
)
def test_it_refuses_malformed_document_urls(url, reason, settings, no_connections):
    settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = False
    with pytest.raises(CIMDError, match=reason):
        cimd.MetadataFetcher().fetch(url)


LISTED = {"client_id": "x", "redirect_uris": ["http://127.0.0.1:9/cb"]}


def test_it_fetches_a_document_and_honours_its_cache_lifetime(host):
    url = host.serve_document("/c.json", LISTED, **{"Cache-Control": "max-age=900"})
    document, max_age = cimd.MetadataFetcher().fetch(url)
    assert document == LISTED
    assert max_age == 900


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"redirect_uris": ["ms-msdt:/id"]}, "operating system"),
        ({"redirect_uris": ["javascript:alert(1)"]}, "javascript:"),
        ({"redirect_uris": ["http://evil.example/cb"]}, "http on another"),
        ({"redirect_uris": []}, "1 to 10"),
        ({"client_name": "Claude\u202e"}, "printable"),
        ({"logo_uri": "javascript:alert(1)"}, "logo_uri"),
    ],
)
def test_a_document_is_held_to_the_rules_a_registration_is(host, fields, reason):
    url = host.serve_document("/c.json", {**LISTED, **fields})
    with pytest.raises(CIMDError, match=reason):
        cimd.MetadataFetcher().fetch(url)


def test_it_does_not_follow_redirects(host):
    host.routes["/moved.json"] = lambda: (302, {"Location": "https://example.com/c.json"}, b"")
    with pytest.raises(CIMDError, match="HTTP 302"):
        cimd.MetadataFetcher().fetch(host.url("/moved.json"))
    assert host.hits == ["/moved.json"]


def test_it_refuses_a_document_over_the_size_limit(host):
    huge = b'{"client_id": "' + b"x" * 20_000 + b'"}'
    host.routes["/huge.json"] = lambda: (200, {"Content-Type": "application/json"}, huge)
    with pytest.raises(CIMDError, match="exceeds the maximum allowed size"):
        cimd.MetadataFetcher().fetch(host.url("/huge.json"))


def test_it_refuses_what_is_not_json(host):
    host.routes["/page"] = lambda: (200, {"Content-Type": "text/html"}, b"<html></html>")
    with pytest.raises(CIMDError, match="not JSON"):
        cimd.MetadataFetcher().fetch(host.url("/page"))


def test_it_gives_up_on_a_stalling_host(host, settings):
    settings.OAUTH2_PROVIDER = {**settings.OAUTH2_PROVIDER, "CIMD_FETCH_TIMEOUT_SECONDS": 1}

    def stall():
        time.sleep(3)
        return 200, {"Content-Type": "application/json"}, b"{}"

    host.routes["/slow.json"] = stall
    started = time.monotonic()
    with pytest.raises(CIMDError, match="could not fetch"):
        cimd.MetadataFetcher().fetch(host.url("/slow.json"))
    assert time.monotonic() - started < 2.5


def test_it_refuses_an_untrusted_certificate(settings, monkeypatch):
    server = MetadataHost()  # its CA is not trusted here
    settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = True
    try:
        url = server.serve_document("/c.json", {"client_id": "x"})
        with pytest.raises(CIMDError, match="could not fetch"):
            cimd.MetadataFetcher().fetch(url)
    finally:
        server.close()


def authorize(client, client_id: str, redirect_uri: str):
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": "s",
        "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        "code_challenge_method": "S256",
        "scope": "memory",
    }
    return client.get("/oauth/authorize/?" + urlencode(query))


def test_the_consent_page_refuses_a_redirect_uri_not_in_the_document(host, cast, client):
    callback = Callback()
    try:
        url = host.url("/c.json")
        host.serve_document(
            "/c.json",
            {
                "client_id": url,
                "client_name": "Doc client",
                "redirect_uris": [callback.url],
                "token_endpoint_auth_method": "none",
            },
        )
        client.force_login(cast.alice)
        good = authorize(client, url, callback.url)
        assert good.status_code == 200
        assert b"Doc client" in good.content
        bad = authorize(client, url, "http://127.0.0.1:9/elsewhere")
        # An error page here, never a redirect to the unlisted URI.
        assert bad.status_code == 400
        assert "Location" not in bad.headers
    finally:
        callback.close()


def test_the_consent_page_refuses_a_document_on_a_private_address(cast, client, settings):
    settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = False
    client.force_login(cast.alice)
    refused = authorize(client, "https://10.20.30.40/client.json", "http://127.0.0.1:9/cb")
    assert refused.status_code == 400
    assert "Location" not in refused.headers


def test_the_consent_page_refuses_a_document_listing_a_redirect_no_client_owns(host, cast, client):
    url = host.url("/c.json")
    host.serve_document(
        "/c.json",
        {
            "client_id": url,
            "client_name": "Doc client",
            "redirect_uris": ["ms-officecmd:launch"],
            "token_endpoint_auth_method": "none",
        },
    )
    client.force_login(cast.alice)

    refused = authorize(client, url, "ms-officecmd:launch")

    assert refused.status_code == 400
    assert "Location" not in refused.headers
    assert b"Doc client" not in refused.content


def test_first_fetches_of_new_documents_are_paced_per_address(host, cast, client, settings):
    """review146: each authorization request naming an unseen https client_id made
    the server fetch it and store a client, before anyone signed in, with no limit
    (60 from one address in 30 s), while /oauth/register/ allows ten an hour."""
    from datetime import timedelta

    from django.utils import timezone

    from accounts import ratelimit
    from oauth.models import Application

    settings.OAUTH_REGISTRATIONS_PER_HOUR = 3
    ratelimit.reset_rate_limiter()
    callback = Callback()
    try:
        urls = [host.url(f"/c{n}.json") for n in range(5)]
        for n, url in enumerate(urls):
            host.serve_document(f"/c{n}.json", {"client_id": url, "redirect_uris": [callback.url]})
        client.force_login(cast.alice)
        answers = [authorize(client, url, callback.url).status_code for url in urls]

        assert answers == [200, 200, 200, 400, 400]
        stored = set(Application.objects.values_list("client_id", flat=True))
        assert stored >= set(urls[:3]) and not stored & set(urls[3:])
        # A client already stored is not a first sight: it is not paced, nor is
        # the fetch again of its stale document (review148: each one spent the
        # allowance, and past it the document was not fetched again).
        assert authorize(client, urls[0], callback.url).status_code == 200
        ratelimit.reset_rate_limiter()
        for _ in range(3):
            Application.objects.filter(client_id=urls[0]).update(
                cimd_expires_at=timezone.now() - timedelta(seconds=1), name="old name"
            )
            assert authorize(client, urls[0], callback.url).status_code == 200
            assert Application.objects.get(client_id=urls[0]).name != "old name"
        assert authorize(client, urls[3], callback.url).status_code == 200
    finally:
        callback.close()
        ratelimit.reset_rate_limiter()


def test_a_document_client_nobody_approved_in_a_day_is_deleted(db):
    from datetime import timedelta

    from django.utils import timezone

    from oauth import services
    from oauth.models import Application

    made = timezone.now() - timedelta(days=2)
    for approved in (None, made):
        Application.objects.create(
            client_id=f"https://clients.example/{'kept' if approved else 'gone'}.json",
            client_type=Application.CLIENT_PUBLIC,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris="http://127.0.0.1:9/cb",
            registration_source=Application.RegistrationSource.CIMD,
            approved_at=approved,
        )
    Application.objects.update(created=made)

    services.clear_expired()

    assert list(Application.objects.values_list("client_id", flat=True)) == [
        "https://clients.example/kept.json"
    ]
