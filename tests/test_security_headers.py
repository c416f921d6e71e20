"""HSTS and the Content-Security-Policy as a browser receives them, from the real server.

Behind a proxy that ends TLS, a request is https when the proxy says so
(``X-Forwarded-Proto`` from ``FORWARDED_ALLOW_IPS``, 127.0.0.1 here). A
server whose public URL is https then sends Strict-Transport-Security on its
https answers; one served over http (the local default) never does. Pages
carry the policy; the MCP endpoint, JSON throughout, carries none.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from core import csp
from tests.clients import raw_call
from tests.support import LiveServer

HTTPS = {"X-Forwarded-Proto": "https"}


@pytest.fixture
def https_server(transactional_db) -> Iterator[LiveServer]:
    with LiveServer(env={"RECALL_PUBLIC_URL": "https://recall.example.com"}) as live:
        yield live


def get(server: LiveServer, path: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.get(server.url + path, headers=headers or {}, timeout=30)


@pytest.mark.slow
def test_a_server_public_over_https_sends_hsts_on_its_https_answers(https_server, cast):
    page = get(https_server, "/login/", HTTPS)
    assert page.status_code == 200
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert page.headers["Content-Security-Policy"] == csp.POLICY
    assert page.headers["Permissions-Policy"] == csp.PERMISSIONS
    assert "camera=()" in page.headers["Permissions-Policy"]

    # The same request over plain http: browsers ignore HSTS there, and it is not sent.
    assert "Strict-Transport-Security" not in get(https_server, "/login/").headers

    mcp = raw_call(https_server.mcp_url, cast.alice_key.raw, "list_memories", {}, headers=HTTPS)
    assert mcp.status_code == 200
    assert mcp.headers["Content-Type"].startswith("application/json")
    assert "Content-Security-Policy" not in mcp.headers
    assert "Permissions-Policy" not in mcp.headers


def test_a_server_on_http_sends_no_hsts_even_over_a_proxys_https(live):
    page = get(live, "/login/", HTTPS)

    assert page.status_code == 200
    assert "Strict-Transport-Security" not in page.headers
    assert page.headers["Content-Security-Policy"] == csp.POLICY
    assert page.headers["Permissions-Policy"] == csp.PERMISSIONS
