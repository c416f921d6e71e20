"""Every remote endpoint server.json advertises is one the server serves."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx2
import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

MANIFEST = json.loads((settings.BASE_DIR / "server.json").read_text())


@pytest.mark.parametrize("remote", MANIFEST["remotes"], ids=lambda remote: remote["url"])
def test_every_remote_is_an_endpoint_the_server_serves(live, remote):
    path = urlsplit(remote["url"]).path

    response = httpx2.post(
        f"{live.url}{path}",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
        timeout=30,
    )

    # Without credentials: refused as unauthenticated, not "no such page".
    assert response.status_code == 401, (path, response.status_code)
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
