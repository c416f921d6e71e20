"""The authorization-code flow as a signed-in user's browser walks it, for tests.

Register a client, open its consent page, allow it, take the code from the
redirect and exchange it, with PKCE (S256) throughout.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.test import Client

CALLBACK = "http://127.0.0.1:33418/callback"
VERIFIER = "a-long-enough-code-verifier-for-pkce-s256-0123456789"
CHALLENGE = (
    base64.urlsafe_b64encode(hashlib.sha256(VERIFIER.encode()).digest()).rstrip(b"=").decode()
)


def register(
    client: Client, name: str = "Desk Helper", redirect_uris: list[str] | None = None
) -> str:
    """Register a public client redirecting to ``CALLBACK`` (or ``redirect_uris``); its id."""
    registered = client.post(
        "/oauth/register/",
        data=json.dumps(
            {
                "client_name": name,
                "redirect_uris": redirect_uris or [CALLBACK],
                "token_endpoint_auth_method": "none",
            }
        ),
        content_type="application/json",
    )
    assert registered.status_code == 201, registered.content
    return str(registered.json()["client_id"])


def request_params(client_id: str, **extra: str) -> dict[str, str]:
    """An authorization request's parameters; an empty value in ``extra`` leaves one out."""
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": CALLBACK,
        "state": "s1",
        "scope": "memory",
        "code_challenge": CHALLENGE,
        "code_challenge_method": "S256",
        **extra,
    }
    return {k: v for k, v in params.items() if v}


def hidden_fields(page: Any) -> dict[str, str]:
    form = page.content.decode().split('id="authorizationForm"', 1)[1]
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', form)
    }


def allow(client: Client, page: Any, **choice: str) -> Any:
    return client.post("/oauth/authorize/", {**hidden_fields(page), "allow": "Authorize", **choice})


def code_from(response: Any) -> str:
    assert response.status_code == 302, response.content
    location = urlsplit(response.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    return parse_qs(location.query)["code"][0]


def exchange(client: Client, client_id: str, code: str, **extra: str) -> Any:
    return client.post(
        "/oauth/token/",
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": CALLBACK,
            "client_id": client_id,
            "code_verifier": VERIFIER,
            **extra,
        },
    )
