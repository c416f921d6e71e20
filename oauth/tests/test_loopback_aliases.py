"""A loopback public URL answers to every loopback name: localhost, 127.0.0.1 and [::1].

The default public URL is ``http://127.0.0.1:PORT``, and clients are often
given ``http://localhost:PORT/...``. The endpoint is one resource by any of
those names, and by no other; a public URL that is not loopback has no aliases.
The SDK's client end to end is in tests/test_oauth_flow.py.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from oauth import resources

CALLBACK = "http://127.0.0.1:33418/callback"
S256_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.RECALL_PUBLIC_URL = "http://127.0.0.1:8106"


def test_the_endpoint_is_named_at_the_loopback_name_the_request_used():
    assert resources.identifier("/agent/mcp", "localhost:8106") == "http://localhost:8106/agent/mcp"
    assert resources.identifier("/mcp", "[::1]:8106") == "http://[::1]:8106/mcp"
    assert (
        resources.metadata_url("/agent/mcp", "LOCALHOST:8106")
        == "http://localhost:8106/.well-known/oauth-protected-resource/agent/mcp"
    )


@pytest.mark.parametrize(
    "host",
    [
        None,
        "example.com:8106",  # not loopback
        "localhost:8107",  # another port: another server
        "localhost",  # port 80: another server
        "evil@localhost:8106",
        "localhost:8106/x",
        "localhost:bad",
    ],
)
def test_any_other_host_gets_the_public_url(host):
    assert resources.identifier("/agent/mcp", host) == "http://127.0.0.1:8106/agent/mcp"


def test_a_public_url_that_is_not_loopback_has_no_aliases(settings):
    settings.RECALL_PUBLIC_URL = "https://recall.example.com"

    assert resources.identifier("/mcp", "localhost:443") == "https://recall.example.com/mcp"
    assert not resources.same("https://localhost/mcp", "https://127.0.0.1/mcp")
    assert not resources.is_known("https://localhost/mcp")


def test_loopback_names_are_one_resource_per_endpoint_and_nothing_more():
    assert resources.is_known("http://localhost:8106/agent/mcp")
    assert resources.is_known("http://[::1]:8106/v1/mcp")
    assert resources.same("http://localhost:8106/agent/mcp", "http://127.0.0.1:8106/agent/mcp")
    # Never across endpoints, ports or schemes, and never for a host that is not loopback.
    assert not resources.same("http://localhost:8106/agent/mcp", "http://127.0.0.1:8106/mcp")
    assert not resources.is_known("http://localhost:8107/agent/mcp")
    assert not resources.is_known("https://localhost:8106/agent/mcp")
    assert not resources.is_known("http://127.0.0.2:8106/agent/mcp")
    assert not resources.is_known("http://recall.localhost:8106/agent/mcp")


def test_an_authorization_request_for_localhost_goes_to_sign_in(db, client):
    registered = client.post(
        "/oauth/register/",
        data=json.dumps({"redirect_uris": [CALLBACK], "token_endpoint_auth_method": "none"}),
        content_type="application/json",
    )
    query = {
        "response_type": "code",
        "client_id": registered.json()["client_id"],
        "redirect_uri": CALLBACK,
        "scope": "memory",
        "code_challenge": S256_CHALLENGE,
        "code_challenge_method": "S256",
        "resource": "http://localhost:8106/agent/mcp",
    }

    response = client.get("/oauth/authorize/?" + urlencode(query))

    assert response.status_code == 302, response.content.decode()[:500]
    assert response["Location"].startswith("/login/?next=")
