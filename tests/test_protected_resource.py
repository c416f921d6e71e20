"""/mcp and /agent/mcp as OAuth protected resources, on the session's live server.

The discovery documents (RFC 9728 and RFC 8414), the 401 challenge that
points at them, and what a bearer token may do: a live token acts as its
agent at the endpoint it was issued for, and an expired one, one bound to
another resource or one whose agent is gone is refused. Tokens are minted
here the way the authorization server stores them (hashed, with their agent
and resource); the whole browser flow that issues them is in
``test_oauth_flow.py``.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from django.utils import timezone
from oauth2_provider.models import set_token_value

from accounts.models import Agent
from accounts.services import delete_agent
from core import tenancy
from memories.models import Memory
from oauth.models import AccessToken, Application
from tests.clients import call, raw_call, structured
from tests.conftest import usage_events
from tests.support import LiveServer, store_memory


def mint(user: Any, agent: Agent, resource: str, *, expires_in: int = 3600) -> str:
    """Store an access token as the authorization server does, and return the raw token."""
    application, _ = Application.objects.get_or_create(
        client_id="https://client.example/recall.json",
        defaults={
            "name": "Test Assistant",
            "client_type": Application.CLIENT_PUBLIC,
            "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": "http://127.0.0.1:9/callback",
        },
    )
    raw = secrets.token_urlsafe(30)
    token = AccessToken(
        user=user,
        agent=agent,
        application=application,
        scope="memory",
        resource=[resource],
        expires=timezone.now() + timedelta(seconds=expires_in),
    )
    set_token_value(token, raw)
    token.save()
    return raw


def challenge(response: httpx2.Response) -> str:
    assert response.status_code == 401, response.text
    return response.headers["www-authenticate"]


@pytest.mark.parametrize("path", ["/mcp", "/agent/mcp", "/v1/mcp"])
def test_an_anonymous_call_is_pointed_at_the_endpoints_metadata(live, path):
    response = httpx2.post(live.url + path, json={}, headers={"Accept": "application/json"})

    header = challenge(response)
    assert f'resource_metadata="{live.url}/.well-known/oauth-protected-resource{path}"' in header
    assert 'scope="memory"' in header
    assert "error=" not in header  # no credential is not a bad credential


@pytest.mark.parametrize(
    ("document", "resource", "name"),
    [
        ("/.well-known/oauth-protected-resource/mcp", "/mcp", "Recall"),
        ("/.well-known/oauth-protected-resource/agent/mcp", "/agent/mcp", "Recall (agent tools)"),
        # It was named for the agent tools too.
        ("/.well-known/oauth-protected-resource/v1/mcp", "/v1/mcp", "Recall (v1 tools)"),
        # Clients that look only at the root get /mcp's.
        ("/.well-known/oauth-protected-resource", "/mcp", "Recall"),
    ],
)
def test_each_endpoint_publishes_its_protected_resource_metadata(live, document, resource, name):
    response = httpx2.get(live.url + document)

    assert response.status_code == 200
    metadata = response.json()
    assert metadata["resource"] == live.url + resource
    assert metadata["resource_name"] == name
    assert metadata["authorization_servers"] == [live.url]
    assert metadata["scopes_supported"] == ["memory"]


def test_the_authorization_server_publishes_oauth_2_1_metadata(live):
    metadata = httpx2.get(live.url + "/.well-known/oauth-authorization-server").json()

    assert metadata["issuer"] == live.url
    assert metadata["authorization_endpoint"] == live.url + "/oauth/authorize/"
    assert metadata["token_endpoint"] == live.url + "/oauth/token/"
    assert metadata["revocation_endpoint"] == live.url + "/oauth/revoke/"
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["response_types_supported"] == ["code"]
    assert set(metadata["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert metadata["client_id_metadata_document_supported"] is True
    # Dynamic registration is on unless OAUTH_DYNAMIC_REGISTRATION turns it off:
    # most clients have no metadata document and register.
    assert metadata["registration_endpoint"] == live.url + "/oauth/register/"


def test_a_token_for_mcp_acts_as_its_agent(live, cast, agents):
    store_memory(cast.alice, "Alice's user-wide note: the launch is in Lisbon.")
    store_memory(cast.alice, "Research's note: the launch slipped to May.", agent=agents.research)
    token = mint(cast.alice, agents.writer, live.url + "/mcp")

    stored = call(live.mcp_url, token, "remember", {"content": "Writer's note: launch copy done."})
    found = call(live.mcp_url, token, "recall", {"query": "When is the launch?", "threshold": 0})
    listed = call(live.mcp_url, token, "list_memories", {})

    assert structured(stored)["deduped"] is False
    # The writer sees its own memory only: not Alice's user-wide ones, not research's.
    assert [m["content"] for m in structured(found)["memories"]] == [
        "Writer's note: launch copy done."
    ]
    assert [m["content"] for m in structured(listed)["memories"]] == [
        "Writer's note: launch copy done."
    ]
    with tenancy.operator():
        memory = Memory.objects.get(content="Writer's note: launch copy done.")
    assert memory.agent_id == agents.writer.id
    # Metered like a key's call, against Alice, recording the agent and no key.
    events = usage_events(3, tool_name__in=["remember", "recall", "list_memories"])
    assert {(e.user_id, e.agent_id, e.api_key_id) for e in events} == {
        (cast.alice.id, agents.writer.id, None)
    }


def test_a_token_for_v1_mcp_acts_as_its_agent_with_seed_001s_tools(live, cast, agents):
    store_memory(cast.alice, "Research's note: the launch slipped to May.", agent=agents.research)
    token = mint(cast.alice, agents.writer, live.url + "/v1/mcp")
    url = live.url + "/v1/mcp"

    added = call(url, token, "add_memory", {"content": "Writer's note: copy done.", "async": False})
    found = call(url, token, "search_memory", {"query": "What is the launch status?"})
    history = call(url, token, "get_memory_history", {"memory_id": structured(added)["memory_id"]})

    assert [r["memory"] for r in structured(found)["results"]] == ["Writer's note: copy done."]
    assert [h["client"] for h in structured(history)["history"]] == ["v1"]
    with tenancy.operator():
        memory = Memory.objects.get(content="Writer's note: copy done.")
    assert memory.agent_id == agents.writer.id
    # A token for /v1/mcp is for /v1/mcp only.
    assert tools_list(live.mcp_url, token).status_code == 401


def test_an_api_key_still_acts_for_the_whole_account_at_mcp(live, cast, agents):
    store_memory(cast.alice, "Research's note: the launch slipped to May.", agent=agents.research)

    listed = call(live.mcp_url, cast.alice_key.raw, "list_memories", {})

    assert [m["content"] for m in structured(listed)["memories"]] == [
        "Research's note: the launch slipped to May."
    ]


def tools_list(url: str, token: str) -> httpx2.Response:
    return httpx2.post(
        url,
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        timeout=30,
    )


def test_refused_tokens(live, cast, agents):
    for_mcp = mint(cast.alice, agents.writer, live.url + "/mcp")
    assert tools_list(live.mcp_url, for_mcp).status_code == 200

    expired = mint(cast.alice, agents.writer, live.url + "/mcp", expires_in=-1)
    elsewhere = mint(cast.alice, agents.writer, "https://elsewhere.example/mcp")
    for token in (expired, elsewhere, "not-a-token", "x" * 300):
        assert 'error="invalid_token"' in challenge(tools_list(live.mcp_url, token))
    # Audience: the token for /mcp is no good at /agent/mcp.
    assert 'error="invalid_token"' in challenge(tools_list(live.url + "/agent/mcp", for_mcp))

    # Deleting the agent ends its connections at once.
    delete_agent(user_id=cast.alice.id, agent_id=agents.writer.id)
    assert 'error="invalid_token"' in challenge(tools_list(live.mcp_url, for_mcp))


def test_the_agent_endpoints_tools_are_metered_as_its_agent(live, cast, agents):
    token = mint(cast.alice, agents.writer, live.url + "/agent/mcp")
    url = live.url + "/agent/mcp"

    call(url, token, "memory_add", {"content": "Writer's note: the launch copy is done."})
    call(url, token, "memory_search", {"query": "launch copy", "threshold": 0})
    call(url, token, "memory_filters", {})

    # Metered as /mcp meters a key's calls: one event a call, against Alice,
    # recording the agent and no key.
    events = usage_events(3, tool_name__in=["memory_add", "memory_search", "memory_filters"])
    assert sorted(e.tool_name for e in events) == ["memory_add", "memory_filters", "memory_search"]
    assert {(e.user_id, e.agent_id, e.api_key_id) for e in events} == {
        (cast.alice.id, agents.writer.id, None)
    }
    assert all(e.success and e.tokens_consumed == 1 for e in events)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_oauth_draws_on_a_bucket_apart_from_the_keys_and_is_told_when_it_runs_out(cast, agents):
    with LiveServer(env={"RATE_LIMIT_FREE": "2/min"}) as server:  # Alice is on the free tier
        token = mint(cast.alice, agents.writer, server.url + "/agent/mcp")
        answers = [
            raw_call(server.url + "/agent/mcp", token, "memory_filters", {}, call_id=n)
            for n in range(3)
        ]
        # Alice's OAuth bucket is not her key's: the key still has its two calls.
        keyed = raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {})

    assert [a.status_code for a in answers] == [200, 200, 429]
    refused = answers[-1]
    assert refused.headers["ratelimit-limit"] == "2"
    assert refused.json()["error"]["data"]["error"]["code"] == "rate_limited"
    assert keyed.status_code == 200
    events = usage_events(4)
    limited = [e for e in events if e.error_code == "rate_limited"]
    assert [(e.tool_name, e.agent_id, e.tokens_consumed) for e in limited] == [
        ("memory_filters", agents.writer.id, 0)
    ]
