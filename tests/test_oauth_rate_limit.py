"""One user, many OAuth connections, one allowance.

A user may register clients and approve connections as often as they like,
so the rate limit cannot hang on a connection: all of a user's OAuth
connections draw from one bucket, whichever client, agent, approval or
refresh a token came from. Tokens are issued here by the real authorization
server (dynamic registration, the consent page, the token endpoint) and
spent at a live server, once with its buckets in process and once in Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client

from tests.clients import raw_call
from tests.consent import allow, code_from, exchange, register, request_params
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Authorizer:
    """Alice, signed in at the authorization server, registering clients and approving them."""

    def __init__(self, user: Any, resource: str) -> None:
        self.browser = Client()
        self.browser.force_login(user)
        self.resource = resource

    def register(self, name: str) -> str:
        return register(self.browser, name)

    def connect(self, client_id: str, agent: str) -> dict[str, Any]:
        """Approve ``client_id`` as ``agent`` and return the token response."""
        params = request_params(client_id, resource=self.resource)
        page = self.browser.get("/oauth/authorize/?" + urlencode(params))
        assert page.status_code == 200, page.content
        allowed = allow(self.browser, page, agent="new", new_agent=agent)
        issued = exchange(self.browser, client_id, code_from(allowed))
        assert issued.status_code == 200, issued.content
        return dict(issued.json())

    def refresh(self, client_id: str, refresh_token: str) -> dict[str, Any]:
        return self.token(
            grant_type="refresh_token", refresh_token=refresh_token, client_id=client_id
        )

    def token(self, **data: str) -> dict[str, Any]:
        issued = self.browser.post("/oauth/token/", data)
        assert issued.status_code == 200, issued.content
        return dict(issued.json())


@pytest.fixture(params=["in process", "redis"])
def limited_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A live server whose free tier allows two calls a minute, its buckets local or in Redis."""
    env = {"RATE_LIMIT_FREE": "2/min"}  # Alice is on the free tier
    if request.param == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis").url
    with LiveServer(env=env) as live:
        yield live


def test_a_users_oauth_connections_share_one_allowance(cast, settings, limited_server):
    server = limited_server
    settings.RECALL_PUBLIC_URL = server.url  # the resource the tokens are bound to
    endpoint = server.url + "/agent/mcp"
    alice = Authorizer(cast.alice, endpoint)
    desk, laptop = alice.register("Desk Helper"), alice.register("Laptop Helper")
    first = alice.connect(desk, agent="desk")
    second = alice.connect(laptop, agent="laptop")
    again = alice.connect(desk, agent="desk again")

    def status(token: dict[str, Any], n: int) -> int:
        answer = raw_call(endpoint, token["access_token"], "memory_filters", {}, call_id=n)
        return answer.status_code

    spent = [status(first, 1), status(first, 2)]  # the free tier's whole burst
    # Each of these would be a bucket of its own if buckets followed connections.
    others = {
        "a second client": second,
        "the first client approved again": again,
        "a refresh": alice.refresh(desk, first["refresh_token"]),
    }
    beyond = {how: status(token, 3) for how, token in others.items()}
    # Alice's API key keeps its own allowance.
    keyed = raw_call(server.mcp_url, cast.alice_key.raw, "list_memories", {})

    assert spent == [200, 200]
    assert beyond == {how: 429 for how in others}
    assert keyed.status_code == 200
