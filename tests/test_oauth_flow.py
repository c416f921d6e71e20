"""The whole OAuth flow over real sockets, as a standards-following MCP client meets it.

The ``mcp`` SDK's own OAuth client connects to ``/agent/mcp`` knowing only
the URL: it gets a 401, reads the protected-resource metadata and the
authorization server's metadata, identifies itself by a Client ID Metadata
Document (served over https by a loopback host with a throwaway CA) or
registers dynamically, and sends the user to the consent page. Headless
Chromium (Debian's, through Playwright) signs Alice in there and approves,
choosing an agent. The client then calls tools and sees only that agent's
memory. Refresh, revocation and the refusals run against the same server.

The server trusts the test CA through ``SSL_CERT_FILE`` and may fetch
metadata documents from loopback only because ``OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES``
is on for it; https stays required. The fetcher's refusals of private
addresses with that setting off are in ``test_cimd_fetcher.py``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx2
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl

from accounts.models import Agent
from core import tenancy
from memories.models import Memory
from tests.browser import accept_dialogs, csp_violations
from tests.oauth_servers import Callback, MetadataHost
from tests.support import LiveServer, store_memory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("RECALL_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
PASSWORD = "an-oauth-password-1"


@pytest.fixture
def alice(cast, agents):
    """Alice, with a password the server can check, and memories of every kind of owner."""
    cast.alice.password = PBKDF2PasswordHasher().encode(PASSWORD, "oauthtestsalt")
    cast.alice.save(update_fields=["password"])
    store_memory(cast.alice, "Alice's user-wide note: the office is in Lisbon.")
    store_memory(
        cast.alice, "Writer's draft: the launch post is due on Friday.", agent=agents.writer
    )
    store_memory(cast.charlie, "Charlie's secret: the launch is cancelled.", agent=agents.helper)
    return cast


@pytest.fixture
def metadata_host() -> Iterator[MetadataHost]:
    host = MetadataHost()
    yield host
    host.close()


@pytest.fixture
def callback() -> Iterator[Callback]:
    catcher = Callback()
    yield catcher
    catcher.close()


@pytest.fixture
def server(transactional_db, metadata_host) -> Iterator[LiveServer]:
    env = {
        "SSL_CERT_FILE": str(metadata_host.ca_file),
        "OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES": "true",
        "RATE_LIMIT_FREE": "1000/min",
    }
    with LiveServer(env=env) as live:
        yield live


@pytest.fixture
def default_server(transactional_db) -> Iterator[LiveServer]:
    """A server as `make serve` starts it: no OAuth setting of any kind."""
    with LiveServer() as live:
        yield live


@pytest.fixture
def browser_available() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright)")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"Chromium is not at {CHROMIUM} (apt-get install chromium)")


def approve(
    url: str,
    callback: Callback,
    *,
    agent: str | None = None,
    new_agent: str = "",
    seen: dict[str, str] | None = None,
) -> dict:
    """Sign Alice in and approve the consent page in Chromium; return the redirect's query.

    With neither ``agent`` nor ``new_agent``, click Allow on the page as it
    opens. ``seen`` collects what the page showed. No page on the way may
    break its Content-Security-Policy: the redirect to the client that
    answers Allow is one form-action must let through. Runs in a worker
    thread: Playwright's sync API owns the thread it runs in.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        page.set_default_timeout(20_000)
        violations = csp_violations(page)
        page.goto(url)
        page.fill("#id_username", "alice@example.com")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("#authorizationForm")
        if seen is not None:
            seen["account"] = page.locator("[data-account]").inner_text()
            seen["client"] = page.locator("[data-client-name]").inner_text()
            seen["new_agent"] = page.input_value("#id_new_agent")
            seen["untrusted"] = str(page.locator("[data-untrusted]").count())
        if new_agent:
            page.fill("#id_new_agent", new_agent)
            page.check("#agent-new")
        elif agent:
            page.check(f"label.choice:has-text('{agent}') input[type=radio]")
        page.click("button[name=allow]")
        query = callback.wait()
        browser.close()
    assert violations == []
    return query


class Storage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def sdk_client(
    server: LiveServer,
    callback: Callback,
    storage: Storage,
    *,
    metadata_url: str | None,
    agent: str | None = None,
    new_agent: str = "",
    path: str = "/agent/mcp",
    seen: dict[str, str] | None = None,
    base: str | None = None,
) -> tuple[Client, list[str]]:
    """The SDK's client and the authorization URLs it sent the user to; ``base``: the URL it was
    given, when not the server's own (``http://localhost:PORT`` for ``127.0.0.1``)."""
    visited: list[str] = []
    url = (base or server.url) + path

    async def redirect(url: str) -> None:
        visited.append(url)

    async def come_back() -> AuthorizationCodeResult:
        query = await anyio.to_thread.run_sync(
            lambda: approve(visited[-1], callback, agent=agent, new_agent=new_agent, seen=seen)
        )
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="Test Assistant",
            redirect_uris=[AnyUrl(callback.url)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
            scope="memory",
        ),
        storage=storage,
        redirect_handler=redirect,
        callback_handler=come_back,
        client_metadata_url=metadata_url,
    )
    http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(60, read=120))
    return Client(streamable_http_client(url, http_client=http)), visited


def client_document(metadata_host: MetadataHost, callback: Callback) -> str:
    path = "/clients/test-assistant.json"
    url = metadata_host.url(path)
    metadata_host.serve_document(
        path,
        {
            "client_id": url,
            "client_name": "Test Assistant",
            "redirect_uris": [callback.url],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        },
    )
    return url


async def use_tools(client: Client) -> dict[str, Any]:
    async with client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        added = await client.call_tool(
            "memory_add",
            {
                "messages": [
                    {"role": "user", "content": "Remember that my cat is called Miso."},
                    {"role": "assistant", "content": "Noted: your cat is Miso."},
                ],
                "thread_id": "chat-1",
            },
        )
        found = await client.call_tool("memory_search", {"query": "What is the launch about?"})
        cat = await client.call_tool("memory_search", {"query": "What is my cat called?"})
        filters = await client.call_tool("memory_filters", {})
        answer = await client.call_tool("memory_recall", {"query": "What is my cat called?"})
    return {
        "tools": listed,
        "added": added.structured_content,
        "launch": found.structured_content,
        "cat": cat.structured_content,
        "filters": filters.structured_content,
        "answer": answer.structured_content,
    }


def test_a_client_with_a_metadata_document_connects_with_the_url_alone(
    alice, server, metadata_host, callback, browser_available
):
    storage = Storage()
    url = client_document(metadata_host, callback)
    client, visited = sdk_client(server, callback, storage, metadata_url=url, agent="research")

    seen = anyio.run(use_tools, client)

    # The client discovered everything from the 401 and used its document as its id.
    [authorize] = visited
    assert authorize.startswith(server.url + "/oauth/authorize/?")
    assert "client_id=" + url.replace(":", "%3A").replace("/", "%2F") in authorize
    assert metadata_host.hits == ["/clients/test-assistant.json"]  # fetched once, then cached
    assert seen["tools"] == {"memory_add", "memory_search", "memory_recall", "memory_filters"}
    assert seen["added"]["count"] == 2

    # Only research's memory: not the writer's, not Alice's user-wide, not Charlie's.
    contents = [m["content"] for m in seen["launch"]["memories"]]
    assert not any("launch" in c or "Lisbon" in c for c in contents), contents
    assert seen["cat"]["memories"][0]["content"] == "Remember that my cat is called Miso."
    assert seen["cat"]["memories"][0]["thread_id"] == "chat-1"
    assert seen["filters"] == {
        "source_kinds": ["conversation"],
        "authors": ["assistant", "user"],
        "paths": [],
    }
    assert seen["answer"]["mode"] == "extractive"
    assert "Miso" in seen["answer"]["answer"]
    assert storage.tokens is not None and storage.tokens.refresh_token


def test_a_client_without_a_document_registers_with_a_default_server_and_allow_alone_works(
    alice, default_server, callback, browser_available
):
    # Nothing set on the server: this is `make serve`. The SDK's client finds
    # the registration endpoint in the metadata, registers, and the user
    # clicks Allow on the consent page as it opens.
    advertised = httpx2.get(f"{default_server.url}/.well-known/oauth-authorization-server").json()
    assert advertised["registration_endpoint"] == f"{default_server.url}/oauth/register/"
    storage = Storage()
    seen: dict[str, str] = {}
    client, visited = sdk_client(default_server, callback, storage, metadata_url=None, seen=seen)

    used = anyio.run(use_tools, client)

    assert storage.client is not None and storage.client.client_id
    assert not storage.client.client_id.startswith("https://")  # registered, not a document
    [authorize] = visited
    assert f"client_id={storage.client.client_id}" in authorize
    assert seen == {
        "account": "alice@example.com",
        "client": "Test Assistant",
        "new_agent": "Test Assistant",  # the new agent is named after the client
        "untrusted": "1",  # and the page says that name is the client's own claim
    }
    assert used["added"]["count"] == 2
    # A brand-new agent, named after the client, holds only what this connection wrote.
    assert used["launch"]["memories"] == [] or all(
        "launch" not in m["content"] for m in used["launch"]["memories"]
    )
    with tenancy.tenant(alice.alice.id):
        agent = Agent.objects.get(user=alice.alice, name="Test Assistant")
        assert Memory.objects.filter(agent=agent).count() == 2


def test_a_client_given_localhost_connects_to_a_default_server_that_says_127_0_0_1(
    alice, default_server, callback, browser_available
):
    # The default public URL names 127.0.0.1; mcp-remote and others speak plain
    # http only to localhost. The SDK's client refuses a metadata document whose
    # resource is not the URL it was given, so the document must say localhost.
    base = default_server.url.replace("127.0.0.1", "localhost")
    storage = Storage()
    client, visited = sdk_client(default_server, callback, storage, metadata_url=None, base=base)

    used = anyio.run(use_tools, client)

    [authorize] = visited
    # The authorization server stays the issuer it is; the token is for localhost's endpoint.
    assert authorize.startswith(default_server.url + "/oauth/authorize/?")
    assert "resource=" + f"{base}/agent/mcp".replace(":", "%3A").replace("/", "%2F") in authorize
    assert used["added"]["count"] == 2
    assert storage.tokens is not None
    token = storage.tokens.access_token
    # The same endpoint by its other loopback name takes it; another endpoint does not.
    assert tools_list(default_server, token).status_code == 200
    assert tools_list(default_server, token, "/mcp").status_code == 401


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    return verifier, challenge.rstrip(b"=").decode()


def authorize_by_hand(
    server: LiveServer, callback: Callback, client_id: str, challenge: str, resource: str
) -> str:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": callback.url,
        "state": "s1",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "scope": "memory",
        "resource": resource,
    }
    query = approve(f"{server.url}/oauth/authorize/?{urlencode(params)}", callback, agent="writer")
    assert query.get("state") == "s1", query
    assert query["iss"] == server.url  # RFC 9207
    return query["code"]


def token_request(server: LiveServer, **data: str) -> httpx2.Response:
    return httpx2.post(f"{server.url}/oauth/token/", data=data, timeout=30)


def exchange(
    server: LiveServer, callback: Callback, client_id: str, code: str, verifier: str
) -> httpx2.Response:
    """Trade an authorization code for tokens, as a public client does."""
    return token_request(
        server,
        grant_type="authorization_code",
        code=code,
        redirect_uri=callback.url,
        client_id=client_id,
        code_verifier=verifier,
    )


def tools_list(server: LiveServer, token: str, path: str = "/agent/mcp") -> httpx2.Response:
    return httpx2.post(
        server.url + path,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        timeout=30,
    )


def connect_by_hand(server: LiveServer, callback: Callback, client_id: str) -> dict[str, Any]:
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, server.url + "/agent/mcp")
    issued = exchange(server, callback, client_id, code, verifier)
    assert issued.status_code == 200, issued.text
    return issued.json()


def test_refresh_rotation_revocation_and_the_refusals(
    alice, server, metadata_host, callback, browser_available
):
    client_id = client_document(metadata_host, callback)
    resource = server.url + "/agent/mcp"
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, resource)

    # A wrong PKCE verifier gets no token.
    wrong = exchange(server, callback, client_id, code, pkce()[0])
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "invalid_grant"
    # The guess spent the code: the right verifier after it gets nothing either.
    late = exchange(server, callback, client_id, code, verifier)
    assert late.status_code == 400
    assert late.json()["error"] == "invalid_grant"

    # A fresh code with the right verifier does.
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, resource)
    issued = exchange(server, callback, client_id, code, verifier)
    assert issued.status_code == 200, issued.text
    tokens = issued.json()
    access, refresh = tokens["access_token"], tokens["refresh_token"]

    assert tools_list(server, access).status_code == 200
    # Audience: a token for /agent/mcp is refused at /mcp, with the challenge for /mcp.
    refused = tools_list(server, access, "/mcp")
    assert refused.status_code == 401
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert "/.well-known/oauth-protected-resource/mcp" in refused.headers["www-authenticate"]

    # Refresh rotates: a new pair, and the old access token stops working.
    rotated = token_request(
        server, grant_type="refresh_token", refresh_token=refresh, client_id=client_id
    )
    assert rotated.status_code == 200, rotated.text
    fresh = rotated.json()
    assert fresh["refresh_token"] != refresh
    assert tools_list(server, access).status_code == 401
    assert tools_list(server, fresh["access_token"]).status_code == 200

    # Replaying the rotated-out refresh token is refused and ends the whole family.
    replay = token_request(
        server, grant_type="refresh_token", refresh_token=refresh, client_id=client_id
    )
    assert replay.status_code == 400
    assert tools_list(server, fresh["access_token"]).status_code == 401

    # A code used a second time is refused, and revokes what its first use issued,
    # rotated tokens included (RFC 6749 4.1.2): one of the two holders stole it.
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, resource)
    first = exchange(server, callback, client_id, code, verifier).json()
    turned = token_request(
        server,
        grant_type="refresh_token",
        refresh_token=first["refresh_token"],
        client_id=client_id,
    ).json()
    assert tools_list(server, turned["access_token"]).status_code == 200
    again = exchange(server, callback, client_id, code, verifier)
    assert again.status_code == 400
    assert again.json()["error"] == "invalid_grant"
    assert tools_list(server, turned["access_token"]).status_code == 401
    after = token_request(
        server,
        grant_type="refresh_token",
        refresh_token=turned["refresh_token"],
        client_id=client_id,
    )
    assert after.status_code == 400

    # One refresh token sent several times at once: one use rotates it, the
    # others are its reuse (invalid_grant, where they were a 500), and the
    # family the winner got is revoked with it.
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, resource)
    held = exchange(server, callback, client_id, code, verifier).json()["refresh_token"]
    with ThreadPoolExecutor(6) as pool:
        racing = list(
            pool.map(
                lambda _: token_request(
                    server, grant_type="refresh_token", refresh_token=held, client_id=client_id
                ),
                range(6),
            )
        )
    won = [r for r in racing if r.status_code == 200]
    assert len(won) == 1
    assert [r.json()["error"] for r in racing if r.status_code != 200] == ["invalid_grant"] * 5
    assert tools_list(server, won[0].json()["access_token"]).status_code == 401

    # Revocation (RFC 7009) of a new connection's token takes effect at once.
    verifier, challenge = pkce()
    code = authorize_by_hand(server, callback, client_id, challenge, resource)
    third = exchange(server, callback, client_id, code, verifier).json()
    assert tools_list(server, third["access_token"]).status_code == 200
    revoked = httpx2.post(
        f"{server.url}/oauth/revoke/",
        data={"token": third["access_token"], "client_id": client_id},
        timeout=30,
    )
    assert revoked.status_code == 200
    assert tools_list(server, third["access_token"]).status_code == 401

    # API keys are not accepted at the OAuth-only endpoint.
    keyed = tools_list(server, alice.alice_key.raw)
    assert keyed.status_code == 401
    assert "not API keys" in keyed.json()["error"]["message"]


def test_the_dashboard_manages_agents_and_disconnects_apps(
    alice, server, metadata_host, callback, browser_available
):
    from pathlib import Path

    from django.conf import settings
    from playwright.sync_api import sync_playwright

    client_id = client_document(metadata_host, callback)
    tokens = connect_by_hand(server, callback, client_id)
    assert tools_list(server, tokens["access_token"]).status_code == 200
    shots = Path(settings.BASE_DIR) / "artifacts" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.set_default_timeout(20_000)
        violations = csp_violations(page)
        asked = accept_dialogs(page)
        page.goto(server.url + "/agents/")
        page.fill("#id_username", "alice@example.com")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(server.url + "/agents/")
        rows = page.locator("tr[data-agent-id]")
        assert rows.count() == 2  # research and writer
        writer = page.locator("tr[data-agent-id]:has-text('writer') [data-memories]")
        assert writer.inner_text() == "1"

        page.fill("#id_agent_name", "scratch")
        page.click("button:has-text('Create agent')")
        page.wait_for_selector("text=Agent scratch created.")
        assert rows.count() == 3
        page.screenshot(path=str(shots / "8-agents.png"), full_page=True)
        page.locator("tr:has-text('scratch') button:has-text('Delete')").click()
        page.wait_for_selector("text=Agent scratch deleted")
        assert rows.count() == 2

        page.click("nav >> text=Connected apps")
        row = page.locator("tr[data-connection-id]")
        assert row.count() == 1
        assert "Test Assistant" in row.inner_text()
        assert row.locator("[data-agent]").inner_text() == "writer"
        assert f"localhost:{metadata_host.port}" in row.inner_text()
        page.screenshot(path=str(shots / "9-connected-apps.png"), full_page=True)
        row.locator("button:has-text('Disconnect')").click()
        page.wait_for_selector("text=Disconnected.")
        assert page.locator("tr[data-connection-id]").count() == 0
        browser.close()

    # Each delete asked first (the dashboard's script), and nothing broke the page's policy.
    assert asked == [
        "Delete scratch? Its memories, keys and connections are deleted too.",
        "Disconnect Test Assistant? It stops working at once.",
    ]
    assert violations == []

    assert tools_list(server, tokens["access_token"]).status_code == 401
    refreshed = token_request(
        server,
        grant_type="refresh_token",
        refresh_token=tokens["refresh_token"],
        client_id=client_id,
    )
    assert refreshed.status_code == 400
