"""Authorization requests are checked before anyone is asked to sign in.

An unknown client, a redirect URI the client did not register, a missing
or plain PKCE challenge and a resource that is not one of Recall's
endpoints each get an error page at once: never the password form (which
would invite a password for a request bound to fail), and never a redirect
to an address the client did not register.
"""

from __future__ import annotations

import html
import json
import logging
import re
from datetime import timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.utils import timezone

from oauth.models import Application, Grant

CALLBACK = "http://127.0.0.1:33418/callback"
S256_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


@pytest.fixture
def client_id(db, client) -> str:
    registered = client.post(
        "/oauth/register/",
        data=json.dumps(
            {
                "client_name": "Desk Helper",
                "redirect_uris": [CALLBACK],
                "token_endpoint_auth_method": "none",
            }
        ),
        content_type="application/json",
    )
    assert registered.status_code == 201, registered.content
    return registered.json()["client_id"]


def authorize(client, **params: str):
    query = {
        "response_type": "code",
        "redirect_uri": CALLBACK,
        "state": "s1",
        "scope": "memory",
        "code_challenge": S256_CHALLENGE,
        "code_challenge_method": "S256",
        "resource": "http://localhost:8080/agent/mcp",
        **params,
    }
    return client.get("/oauth/authorize/?" + urlencode({k: v for k, v in query.items() if v}))


def refusal(response) -> str:
    assert response.status_code == 400, response
    assert b"id_password" not in response.content  # no password form
    assert "Location" not in response.headers
    [reason] = re.findall(r'data-refusal="([a-z_]+)"', response.content.decode())
    return reason


def back_link(response) -> dict[str, list[str]] | None:
    links = re.findall(r'href="([^"]+)" data-back', response.content.decode())
    if not links:
        return None
    target = urlsplit(html.unescape(links[0]))
    assert f"{target.scheme}://{target.netloc}{target.path}" == CALLBACK
    return parse_qs(target.query)


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.RECALL_PUBLIC_URL = "http://localhost:8080"


def test_a_good_request_goes_to_sign_in(client, client_id):
    answered = authorize(client, client_id=client_id)

    assert answered.status_code == 302
    assert answered.headers["Location"].startswith("/login/?next=")


def test_an_unknown_client_gets_an_error_page_not_the_sign_in_page(client, db):
    refused = authorize(client, client_id="no-such-client")

    assert refusal(refused) == "unknown_client"
    assert back_link(refused) is None
    assert b"not registered with this server" in refused.content


def test_a_redirect_uri_the_client_did_not_register_is_never_followed(client, client_id):
    refused = authorize(client, client_id=client_id, redirect_uri="https://evil.example/cb")

    assert refusal(refused) == "unregistered_redirect_uri"
    assert back_link(refused) is None
    assert b"evil.example" not in refused.content


@pytest.mark.parametrize(
    "pkce",
    [
        {"code_challenge_method": "plain"},
        {"code_challenge_method": ""},
        {"code_challenge": "", "code_challenge_method": ""},
    ],
    ids=["plain", "method-omitted", "no-challenge"],
)
def test_a_missing_or_plain_pkce_challenge_is_refused_before_sign_in(client, client_id, pkce):
    refused = authorize(client, client_id=client_id, **pkce)

    assert refusal(refused) == "pkce_required"
    query = back_link(refused)
    assert query is not None
    assert query["error"] == ["invalid_request"]
    assert query["state"] == ["s1"]
    assert query["iss"] == ["http://localhost:8080"]


def test_a_resource_that_is_not_ours_is_refused_before_sign_in(client, client_id):
    refused = authorize(client, client_id=client_id, resource="https://elsewhere.example/mcp")

    assert refusal(refused) == "unknown_resource"
    assert b"https://elsewhere.example/mcp" in refused.content
    query = back_link(refused)
    assert query is not None
    assert query["error"] == ["invalid_target"]


@pytest.mark.parametrize(
    "resource",
    [
        # A fragment: RFC 8707 forbids one, and it was compared away.
        ["http://localhost:8080/agent/mcp#x"],
        # Two endpoints: the token was good at both, where it is bound to one.
        ["http://localhost:8080/agent/mcp", "http://localhost:8080/mcp"],
    ],
    ids=["fragment", "two"],
)
def test_a_resource_that_is_not_exactly_one_of_ours_is_refused_before_sign_in(
    client, client_id, resource
):
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": CALLBACK,
        "state": "s1",
        "scope": "memory",
        "code_challenge": S256_CHALLENGE,
        "code_challenge_method": "S256",
    }
    refused = client.get(
        "/oauth/authorize/?" + urlencode([*query.items(), *(("resource", r) for r in resource)])
    )

    assert refusal(refused) == "unknown_resource"
    back = back_link(refused)
    assert back is not None and back["error"] == ["invalid_target"]
    # The page says what was wrong: it called a second endpoint of ours "not an
    # endpoint of this server", then listed it among them.
    page = refused.content.decode()
    several = len(resource) > 1
    assert ("more than one endpoint of this server at once" in page) is several
    assert ("which is not an endpoint of this server" in page) is not several


def test_the_same_checks_hold_for_a_signed_in_user(client, client_id, cast):
    client.force_login(cast.alice)

    assert refusal(authorize(client, client_id="no-such-client")) == "unknown_client"
    assert refusal(authorize(client, client_id=client_id, code_challenge_method="plain")) == (
        "pkce_required"
    )
    assert not Grant.objects.exists()


def test_a_registration_that_expired_unapproved_is_an_unknown_client(client, client_id):
    Application.objects.filter(client_id=client_id).update(
        created=timezone.now() - timedelta(hours=25)
    )

    assert refusal(authorize(client, client_id=client_id)) == "unknown_client"


def test_an_approved_registration_does_not_expire(client, client_id, cast):
    Application.objects.filter(client_id=client_id).update(
        created=timezone.now() - timedelta(days=40), approved_at=timezone.now() - timedelta(days=39)
    )
    client.force_login(cast.alice)

    assert authorize(client, client_id=client_id).status_code == 200


def test_prompt_none_from_someone_not_signed_in_is_login_required_naming_the_issuer(
    client, client_id
):
    # RFC 9207: every authorization response names the issuer, errors too;
    # this one went back without it, and a client guarding against mix-up
    # would discard it.
    refused = authorize(client, client_id=client_id, prompt="none")

    assert refused.status_code == 302
    location = urlsplit(refused["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    query = parse_qs(location.query)
    assert query["error"] == ["login_required"]
    assert query["state"] == ["s1"]
    issuer = client.get("/.well-known/oauth-authorization-server").json()["issuer"]
    assert query["iss"] == [issuer]


def test_a_metadata_document_that_cannot_be_used_is_named_as_such_and_logged(db, client, caplog):
    # A loopback address: the fetcher refuses it before connecting.
    document = "https://127.0.0.1:9/clients/helper.json"

    with caplog.at_level(logging.WARNING, logger="oauth.cimd"):
        refused = authorize(client, client_id=document)

    assert refusal(refused) == "client_document_unusable"
    assert b"could not use it" in refused.content
    assert b"not registered with this server" not in refused.content
    [logged] = [r for r in caplog.records if r.name == "oauth.cimd"]
    assert logged.levelno == logging.WARNING
    assert "non-public address" in logged.reason
