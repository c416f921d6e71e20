"""Every remote endpoint server.json advertises is served, and asks for what the manifest says."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx2
import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

MANIFEST = json.loads((settings.BASE_DIR / "server.json").read_text())


def tools_list(url: str, key: str | None = None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx2.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={**headers, "MCP-Protocol-Version": "2025-11-25"},
        timeout=30,
    )


@pytest.mark.parametrize("remote", MANIFEST["remotes"], ids=lambda remote: remote["url"])
def test_every_remote_is_an_endpoint_the_server_serves(live, cast, remote):
    url = live.url + urlsplit(remote["url"]).path
    offers_a_key = any(header["name"] == "Authorization" for header in remote.get("headers", []))

    anonymous = tools_list(url)
    with_key = tools_list(url, cast.alice_key.raw)

    # Without credentials: refused as unauthenticated, not "no such page", and
    # told where to sign in, so a client with only the URL can use OAuth.
    assert anonymous.status_code == 401, anonymous.text
    assert 'resource_metadata="' in anonymous.headers["WWW-Authenticate"]
    # An API key works exactly where the manifest offers the header for one.
    assert (with_key.status_code == 200) is offers_a_key, (url, with_key.status_code)
    if offers_a_key:
        assert with_key.json()["result"]["tools"]
