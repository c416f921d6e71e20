"""The authorization endpoint takes PKCE with S256 and nothing less (OAuth 2.1, RFC 9700).

A request with a ``plain`` challenge or none at all never reaches the
consent page, nor the sign-in page before it: it gets an error page, whose
only way on is a link back to the client's (registered) redirect URI
carrying ``invalid_request``; no code is issued.
"""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from oauth.models import Grant
from tests.oauth_servers import Callback

S256_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


@pytest.fixture
def document(host):
    """A client metadata document listing one redirect URI; yields (client_id, redirect_uri)."""
    callback = Callback()
    url = host.url("/pkce-client.json")
    host.serve_document(
        "/pkce-client.json",
        {
            "client_id": url,
            "client_name": "PKCE client",
            "redirect_uris": [callback.url],
            "token_endpoint_auth_method": "none",
        },
    )
    yield url, callback.url
    callback.close()


def authorize(client, client_id: str, redirect_uri: str, **pkce: str):
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": "s",
        "scope": "memory",
        **pkce,
    }
    return client.get("/oauth/authorize/?" + urlencode(query))


def test_an_s256_challenge_reaches_the_consent_page(document, cast, client):
    client_id, redirect_uri = document
    client.force_login(cast.alice)

    page = authorize(
        client, client_id, redirect_uri, code_challenge=S256_CHALLENGE, code_challenge_method="S256"
    )

    assert page.status_code == 200
    assert b"PKCE client" in page.content


@pytest.mark.parametrize(
    "pkce",
    [
        {"code_challenge": S256_CHALLENGE, "code_challenge_method": "plain"},
        {"code_challenge": S256_CHALLENGE},  # no method means plain (RFC 7636 4.3)
        {},
    ],
    ids=["plain", "method-omitted", "no-challenge"],
)
def test_a_plain_or_missing_challenge_is_refused_without_a_code(document, cast, client, pkce):
    client_id, redirect_uri = document
    client.force_login(cast.alice)

    refused = authorize(client, client_id, redirect_uri, **pkce)

    assert refused.status_code == 400
    assert b'data-refusal="pkce_required"' in refused.content
    [back] = re.findall(r'href="([^"]+)" data-back', refused.content.decode())
    location = urlsplit(html.unescape(back))
    assert f"{location.scheme}://{location.netloc}{location.path}" == redirect_uri
    query = parse_qs(location.query)
    assert query["error"] == ["invalid_request"]
    assert query["state"] == ["s"]
    assert "code" not in query
    assert not Grant.objects.exists()


@pytest.mark.parametrize("challenge", ["\u00e9" * 43, "short", S256_CHALLENGE + "A"])
def test_a_challenge_no_s256_verifier_can_match_is_refused_without_a_code(
    document, cast, client, challenge
):
    # One that is not ASCII was issued a code, whose exchange then raised in the
    # comparison: a 500 at the token endpoint.
    client_id, redirect_uri = document
    client.force_login(cast.alice)

    refused = authorize(
        client, client_id, redirect_uri, code_challenge=challenge, code_challenge_method="S256"
    )

    assert refused.status_code == 400
    assert b"code_challenge must be an S256 challenge" in refused.content
    assert not Grant.objects.exists()
