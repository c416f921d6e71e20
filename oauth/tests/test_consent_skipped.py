"""Authorization requests the consent page is skipped for, and the sign-in on their way.

The toolkit issues a code without the page for a client the operator trusts
(``skip_authorization``) and for ``approval_prompt=auto`` when the user
already holds a live token for the client. Such a code must act as an agent,
as every code from the page does, or the token it leads to is refused by
every endpoint. And a sign-in on the way to such a request ends at the
client's redirect URI, which the sign-in page's form-action must allow.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.test import Client

from accounts import services as accounts_services
from accounts.models import Agent
from core import csp, tenancy
from oauth import tokens
from oauth.models import AccessToken, Application, Grant
from oauth.tests.test_consent_page import PUBLIC, form_action, open_consent, request_params
from tests.consent import CALLBACK, allow, code_from, exchange, register


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.RECALL_PUBLIC_URL = PUBLIC


@pytest.fixture
def alice_client(cast) -> Client:
    browser = Client()
    browser.force_login(cast.alice)
    return browser


def authorize(client: Client, client_id: str, **extra: str):
    return client.get("/oauth/authorize/?" + urlencode(request_params(client_id, **extra)))


def connect(client: Client, client_id: str, agent_name: str) -> str:
    """Approve the client on the page as a new agent; the access token."""
    page = open_consent(client, client_id)
    code = code_from(allow(client, page, agent="new", new_agent=agent_name))
    issued = exchange(client, client_id, code)
    assert issued.status_code == 200, issued.content
    return str(issued.json()["access_token"])


def agent_of(code: str):
    return Grant.objects.get(code=code).agent_id


def test_approval_prompt_auto_goes_on_as_the_connected_agent(cast, alice_client):
    client_id = register(alice_client)
    first = tokens.look_up(connect(alice_client, client_id, "desk"))
    assert first is not None

    again = authorize(alice_client, client_id, approval_prompt="auto")

    code = code_from(again)  # straight to the client, no page
    assert agent_of(code) == first.agent_id
    issued = exchange(alice_client, client_id, code)
    assert issued.status_code == 200, issued.content
    bearer = tokens.look_up(issued.json()["access_token"])
    assert bearer is not None and bearer.agent_id == first.agent_id


def test_approval_prompt_auto_without_a_connection_asks(cast, alice_client):
    client_id = register(alice_client)

    page = authorize(alice_client, client_id, approval_prompt="auto")

    assert page.status_code == 200 and b"authorizationForm" in page.content
    assert not Grant.objects.exists()


def test_approval_prompt_auto_asks_when_the_live_token_acts_as_no_agent(cast, alice_client):
    # As the toolkit's own shortcut issued them before codes named an agent there.
    client_id = register(alice_client)
    connect(alice_client, client_id, "desk")
    AccessToken.objects.update(agent=None)

    page = authorize(alice_client, client_id, approval_prompt="auto")

    assert page.status_code == 200 and b"authorizationForm" in page.content
    assert not Grant.objects.filter(spent_at=None).exists()  # the first was spent on its token


def test_approval_prompt_auto_for_another_endpoint_than_the_one_approved_asks(cast, alice_client):
    # Approved for /agent/mcp's tools; asked again for /mcp's, the code went
    # straight to the client and its token worked there.
    client_id = register(alice_client)
    connect(alice_client, client_id, "desk")

    page = authorize(alice_client, client_id, approval_prompt="auto", resource=f"{PUBLIC}/mcp")

    assert page.status_code == 200 and b"authorizationForm" in page.content
    assert not Grant.objects.filter(spent_at=None).exists()  # only the first, spent
    # Without a resource the request is for /mcp, the default, as well.
    params = request_params(client_id, approval_prompt="auto")
    del params["resource"]
    page = alice_client.get("/oauth/authorize/?" + urlencode(params))
    assert page.status_code == 200 and b"authorizationForm" in page.content


def test_approval_prompt_auto_asks_which_when_two_agents_are_connected(cast, alice_client):
    # The client was approved twice, as two agents: which one a session of it
    # acts as is the user's to say, not the newest token's.
    client_id = register(alice_client)
    connect(alice_client, client_id, "work")
    connect(alice_client, client_id, "personal")

    page = authorize(alice_client, client_id, approval_prompt="auto")

    assert page.status_code == 200 and b"authorizationForm" in page.content


def test_a_trusted_client_makes_no_agent_for_a_request_sent_to_sign_in_first(cast, alice_client):
    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)

    sent = authorize(alice_client, client_id, prompt="login")

    assert sent.status_code == 302 and sent.headers["Location"].startswith("/login/")
    with tenancy.tenant(cast.alice.id):
        assert not Agent.objects.filter(user=cast.alice).exists()


def test_a_trusted_client_acts_as_the_agent_of_its_name_then_as_the_same(cast, alice_client):
    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)

    first = code_from(authorize(alice_client, client_id))
    second = code_from(authorize(alice_client, client_id))

    with tenancy.tenant(cast.alice.id):
        [agent] = Agent.objects.filter(user=cast.alice)
    assert agent.name == "House Assistant"
    assert agent_of(first) == agent_of(second) == agent.id
    issued = exchange(alice_client, client_id, second)
    bearer = tokens.look_up(issued.json()["access_token"])
    assert bearer is not None and bearer.agent_id == agent.id


def test_a_trusted_client_takes_the_existing_agent_of_its_name(cast, alice_client):
    existing = accounts_services.create_agent(user_id=cast.alice.id, name="house assistant")
    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)

    code = code_from(authorize(alice_client, client_id))

    assert agent_of(code) == existing.id
    with tenancy.tenant(cast.alice.id):
        assert Agent.objects.filter(user=cast.alice).count() == 1


def test_a_trusted_clients_code_asked_with_head_acts_as_an_agent_too(cast, alice_client):
    # Django answers HEAD with get(): the toolkit issues a code there as well.
    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)

    code = code_from(alice_client.head("/oauth/authorize/?" + urlencode(request_params(client_id))))

    with tenancy.tenant(cast.alice.id):
        [agent] = Agent.objects.filter(user=cast.alice)
    assert agent_of(code) == agent.id


def test_a_trusted_clients_request_refused_after_its_agent_was_made_leaves_none(
    cast, alice_client, monkeypatch
):
    # oauthlib refuses some requests with an error redirect, not an exception,
    # after the checks before the page passed (they run again when the code
    # is made): the agent made for the code goes with it.
    from oauth2_provider.views import AuthorizationView

    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)

    def refused(self, request, scopes, credentials, allow):
        return f"{CALLBACK}?error=invalid_scope&state=s1", {}, None, 302

    monkeypatch.setattr(AuthorizationView, "create_authorization_response", refused)

    sent = authorize(alice_client, client_id)

    assert sent.status_code == 302 and "error=invalid_scope" in sent.headers["Location"]
    with tenancy.tenant(cast.alice.id):
        assert not Agent.objects.filter(user=cast.alice).exists()
    assert Application.objects.get(client_id=client_id).approved_at is None


def test_a_trusted_client_whose_agent_cannot_be_made_gets_access_denied_with_the_issuer(
    cast, alice_client, monkeypatch
):
    from core.errors import ValidationFailed
    from oauth import services as oauth_services

    client_id = register(alice_client, name="House Assistant")
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)
    # The issuer every code names.
    granted = urlsplit(authorize(alice_client, client_id).headers["Location"])
    [issuer] = parse_qs(granted.query)["iss"]
    Grant.objects.all().delete()

    def cannot(**_):
        raise ValidationFailed("You have too many agents.")

    monkeypatch.setattr(oauth_services, "trusted_client_agent", cannot)

    sent = authorize(alice_client, client_id)

    assert sent.status_code == 302
    location = urlsplit(sent.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    query = parse_qs(location.query)
    assert query["error"] == ["access_denied"] and query["state"] == ["s1"]
    assert query["iss"] == [issuer]  # RFC 9207, as on every other answer
    assert not Grant.objects.exists()


def sign_in_page(client_id: str, **extra: str):
    authorize_url = "/oauth/authorize/?" + urlencode(request_params(client_id, **extra))
    page = Client().get("/login/?" + urlencode({"next": authorize_url}))
    assert page.status_code == 200
    return page


def test_a_sign_in_on_the_way_to_a_client_id_no_column_holds_is_the_plain_page(cast):
    # The sign-in page looked the client up to widen its form-action: a 500.
    page = sign_in_page("a\x00b", approval_prompt="auto")

    assert page.headers[csp.HEADER] == csp.POLICY


def test_signing_in_on_the_way_to_a_skipped_page_may_lead_on_to_the_client(cast, alice_client):
    client_id = register(alice_client)

    # A request that will show the consent page: the plain policy.
    assert sign_in_page(client_id).headers[csp.HEADER] == csp.POLICY
    # One that may skip it: its redirect URI's origin too, and nothing else.
    auto = sign_in_page(client_id, approval_prompt="auto")
    assert form_action(auto) == ["'self'", "http://127.0.0.1:33418"]
    assert auto.headers[csp.HEADER].replace(" http://127.0.0.1:33418", "") == csp.POLICY
    # A redirect URI the client never registered: the toolkit would refuse it, so nothing.
    elsewhere = sign_in_page(
        client_id, approval_prompt="auto", redirect_uri="https://evil.example/callback"
    )
    assert elsewhere.headers[csp.HEADER] == csp.POLICY
    # A trusted client, whatever the request asks.
    Application.objects.filter(client_id=client_id).update(skip_authorization=True)
    assert form_action(sign_in_page(client_id)) == ["'self'", "http://127.0.0.1:33418"]
    # No client of that id: nothing.
    assert sign_in_page("no-such-client", approval_prompt="auto").headers[csp.HEADER] == (
        csp.POLICY
    )


def test_signing_in_for_a_client_of_several_redirect_uris_allows_the_one_asked(cast):
    other = "http://127.0.0.1:44444/callback"
    client_id = register(Client(), redirect_uris=[CALLBACK, other])

    asked = sign_in_page(client_id, approval_prompt="auto", redirect_uri=other)
    assert form_action(asked) == ["'self'", "http://127.0.0.1:44444"]
    # Naming none, the request is refused (no default among several): nothing allowed.
    unnamed = sign_in_page(client_id, approval_prompt="auto", redirect_uri="")
    assert unnamed.headers[csp.HEADER] == csp.POLICY


def test_signing_in_still_leads_on_to_the_request(cast, alice_client):
    client_id = register(alice_client)
    cast.alice.set_password("a-sign-in-password-1")
    cast.alice.save(update_fields=["password"])
    authorize_url = "/oauth/authorize/?" + urlencode(request_params(client_id))

    form = {"username": "alice@example.com", "password": "a-sign-in-password-1"}
    signed_in = Client().post("/login/", {**form, "next": authorize_url})

    assert signed_in.status_code == 302
    assert signed_in.headers["Location"] == authorize_url
