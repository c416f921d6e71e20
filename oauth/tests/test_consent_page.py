"""The consent page: whose account, which client (and how far to trust its name), which agent.

Allow alone must work: the new agent's name defaults to the client's, or
the existing agent of that name is chosen. A token request that names no
resource gets the resource of its code, and every code names one.
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.test import Client

from accounts.models import Agent
from core import csp, tenancy
from oauth import tokens
from oauth.models import Application, Grant
from tests import consent
from tests.consent import CALLBACK, CHALLENGE, allow, code_from, exchange, hidden_fields, register

PUBLIC = "http://localhost:8080"


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.RECALL_PUBLIC_URL = PUBLIC


def request_params(client_id: str, **extra: str) -> dict[str, str]:
    return consent.request_params(client_id, **{"resource": f"{PUBLIC}/agent/mcp", **extra})


def open_consent(client: Client, client_id: str, **extra: str):
    page = client.get("/oauth/authorize/?" + urlencode(request_params(client_id, **extra)))
    assert page.status_code == 200, page.content
    return page


@pytest.fixture
def alice_client(cast) -> Client:
    browser = Client()
    browser.force_login(cast.alice)
    return browser


def test_it_names_the_signed_in_account_and_offers_to_switch(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)
    content = page.content.decode()

    assert re.search(r"data-account>alice@example\.com<", content)
    [target] = re.findall(r'name="next" value="([^"]+)"', content)
    switched = alice_client.post("/logout/", {"next": html.unescape(target)})

    # Signed out, and back at the same request, which now asks for a sign-in.
    assert switched.status_code == 302
    again = alice_client.get(switched.headers["Location"])
    assert again.status_code == 302
    assert again.headers["Location"].startswith("/login/?next=")
    back = parse_qs(urlsplit(again.headers["Location"]).query)["next"][0]
    assert parse_qs(urlsplit(back).query)["client_id"] == [client_id]
    assert parse_qs(urlsplit(back).query)["code_challenge"] == [CHALLENGE]


def test_a_registered_clients_name_is_shown_as_its_own_untrusted_claim(cast, alice_client):
    client_id = register(alice_client, name='<img src=x onerror="alert(1)"> Claude')
    content = open_consent(alice_client, client_id).content.decode()

    assert "<img" not in content
    assert "&lt;img src=x" in content
    assert "data-untrusted" in content
    assert "nothing checks it" in content
    assert "data-redirect-host>127.0.0.1:33418<" in content


def test_allow_without_typing_creates_an_agent_named_after_the_client(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)
    content = page.content.decode()
    assert re.search(r'value="new" id="agent-new" checked', content)
    assert 'value="Desk Helper"' in content

    # The form as the browser sends it when Allow is clicked at once.
    code = code_from(allow(alice_client, page, agent="new", new_agent="Desk Helper"))

    with tenancy.tenant(cast.alice.id):
        agent = Agent.objects.get(user=cast.alice, name="Desk Helper")
    assert Grant.objects.get(code=code).agent_id == agent.id
    assert Application.objects.get(client_id=client_id).approved_at is not None


@pytest.mark.parametrize(
    ("tampered", "status"),
    [
        # Refused on a page of ours: a redirect URI the client never registered.
        ({"redirect_uri": "https://evil.example/cb"}, 400),
        # Refused at the client's own redirect URI, with ?error=...: a redirect, no connection.
        ({"scope": "admin everything"}, 302),
        # A challenge the page's request never held: checked on the way in
        # only, a long one failed as the code was stored (a 500), and a short
        # or odd one was issued a code no verifier could redeem.
        ({"code_challenge": "A" * 5000}, 400),
        ({"code_challenge": "short"}, 400),
        ({"code_challenge_method": "plain"}, 400),
    ],
    ids=[
        "refused on a page",
        "refused by an error redirect",
        "challenge too long",
        "challenge malformed",
        "challenge plain",
    ],
)
def test_a_refused_request_leaves_no_agent_behind(cast, alice_client, tampered, status):
    # The agent was made before the toolkit checked the request, and stayed
    # in the user's list when the request was refused.
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)
    form = {**hidden_fields(page), **tampered}

    refused = alice_client.post(
        "/oauth/authorize/", {**form, "allow": "Authorize", "agent": "new", "new_agent": "z"}
    )

    assert refused.status_code == status
    if status == 302:
        assert "error=" in refused.headers["Location"]
    with tenancy.tenant(cast.alice.id):
        assert not Agent.objects.filter(user=cast.alice, name="z").exists()
    assert not Grant.objects.exists()


def test_cancel_sends_the_client_access_denied(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)

    cancelled = alice_client.post("/oauth/authorize/", hidden_fields(page))

    assert cancelled.status_code == 302
    location = urlsplit(cancelled.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    assert parse_qs(location.query)["error"] == ["access_denied"]
    assert parse_qs(location.query)["state"] == ["s1"]
    assert not Grant.objects.exists()
    assert Application.objects.get(client_id=client_id).approved_at is None


def test_an_emptied_name_box_still_names_the_agent_after_the_client(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)

    code_from(allow(alice_client, page, agent="new", new_agent=""))

    with tenancy.tenant(cast.alice.id):
        assert Agent.objects.filter(user=cast.alice, name="Desk Helper").exists()


def test_the_agent_of_the_clients_name_is_chosen_when_it_exists(cast, agents, alice_client):
    client_id = register(alice_client, name="Research")
    content = open_consent(alice_client, client_id).content.decode()

    assert re.search(rf'value="{agents.research.id}" checked', content)
    assert not re.search(r'id="agent-new" checked', content)
    assert 'placeholder="Research 2"' in content  # what an empty box would create

    page = open_consent(alice_client, client_id)
    code_from(allow(alice_client, page, agent="new", new_agent=""))
    with tenancy.tenant(cast.alice.id):
        assert Agent.objects.filter(user=cast.alice, name="Research 2").exists()


def test_a_request_without_a_resource_is_bound_to_mcp_and_its_token_works(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id, resource="")
    assert "through <code>/mcp</code>" in page.content.decode()

    code = code_from(allow(alice_client, page, agent="new", new_agent="desk"))
    issued = exchange(alice_client, client_id, code)  # no resource here either

    assert issued.status_code == 200, issued.content
    bearer = tokens.look_up(issued.json()["access_token"])
    assert bearer is not None
    assert bearer.resources == [f"{PUBLIC}/mcp"]


def test_a_grant_that_names_no_resource_gets_invalid_target_not_a_useless_token(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)
    code = code_from(allow(alice_client, page, agent="new", new_agent="desk"))
    # A code issued before every code named its resource.
    Grant.objects.filter(code=code).update(resource=[])

    refused = exchange(alice_client, client_id, code)

    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_target"
    assert "accepted nowhere" in refused.json()["error_description"]


NATIVE = "cursor://anysphere.cursor-mcp/oauth/callback"


def register_native(client) -> str:
    """Register a native app redirecting to its own scheme, as Cursor does; its client id."""
    registered = client.post(
        "/oauth/register/",
        data=json.dumps(
            {
                "client_name": "Cursor",
                "redirect_uris": [NATIVE],
                "token_endpoint_auth_method": "none",
            }
        ),
        content_type="application/json",
    )
    return str(registered.json()["client_id"])


def test_a_native_client_gets_its_code_at_its_own_scheme(cast, alice_client):
    page = open_consent(alice_client, register_native(alice_client), redirect_uri=NATIVE)

    approved = allow(alice_client, page, agent="new", new_agent="")

    assert approved.status_code == 302
    assert approved.headers["Location"].startswith(NATIVE + "?code=")


def form_action(response) -> list[str]:
    """The page's form-action sources (core/csp.py)."""
    policy = response.headers["Content-Security-Policy"]
    [directive] = [d.split() for d in policy.split(";") if d.split()[0] == "form-action"]
    return directive[1:]


def test_the_consent_form_may_lead_on_to_the_clients_redirect_uri_and_nowhere_else(
    cast, alice_client
):
    # Chromium holds a form to form-action through the redirects that answer it,
    # so Allow and Cancel need the client's origin too; nothing else does.
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)
    assert form_action(page) == ["'self'", "http://127.0.0.1:33418"]
    others = page.headers["Content-Security-Policy"].replace(" http://127.0.0.1:33418", "")
    assert others == csp.POLICY

    # Shown again after a refused choice: the same.
    again = allow(alice_client, page, agent="not-an-agent")
    assert again.status_code == 200 and b"authorizationForm" in again.content
    assert form_action(again) == ["'self'", "http://127.0.0.1:33418"]

    # An error page has no such form: the plain policy.
    refused = alice_client.get(
        "/oauth/authorize/?"
        + urlencode(request_params(client_id, redirect_uri="https://evil.example/callback"))
    )
    assert refused.status_code == 400
    assert refused.headers["Content-Security-Policy"] == csp.POLICY


def test_a_native_clients_consent_form_may_lead_on_to_its_scheme(cast, alice_client):
    page = open_consent(alice_client, register_native(alice_client), redirect_uri=NATIVE)

    assert form_action(page) == ["'self'", "cursor:"]


def test_a_deactivated_user_gets_no_new_token_from_a_code_or_a_refresh(cast, alice_client):
    # Refused at the endpoints while inactive, the tokens a code or a refresh
    # still issued worked again once the account was reactivated.
    client_id = register(alice_client)
    code = code_from(allow(alice_client, open_consent(alice_client, client_id), agent="new"))
    refresh = exchange(alice_client, client_id, code).json()["refresh_token"]
    later = code_from(allow(alice_client, open_consent(alice_client, client_id), agent="new"))
    type(cast.alice).objects.filter(pk=cast.alice.pk).update(is_active=False)

    by_code = exchange(alice_client, client_id, later)
    by_refresh = alice_client.post(
        "/oauth/token/",
        {"grant_type": "refresh_token", "refresh_token": refresh, "client_id": client_id},
    )

    assert (by_code.status_code, by_code.json()["error"]) == (400, "invalid_grant")
    assert (by_refresh.status_code, by_refresh.json()["error"]) == (400, "invalid_grant")


def test_a_new_agent_name_too_long_is_explained_beside_its_box(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id)

    again = allow(alice_client, page, agent="new", new_agent="x" * 65)

    assert again.status_code == 200
    content = again.content.decode()
    # The error is shown, and tied to the box it is about.
    assert 'aria-describedby="id_new_agent_errors"' in content
    [errors] = re.findall(r'<ul class="errorlist" id="id_new_agent_errors">(.*?)</ul>', content)
    assert "at most 64 characters" in errors
    assert not Grant.objects.exists()


def test_prompt_none_when_signed_in_is_consent_required_not_a_page(cast, alice_client):
    client_id = register(alice_client)

    answered = alice_client.get(
        "/oauth/authorize/?" + urlencode(request_params(client_id, prompt="none"))
    )

    assert answered.status_code == 302, answered.content[:300]
    location = urlsplit(answered.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    query = parse_qs(location.query)
    assert query["error"] == ["consent_required"]
    assert query["state"] == ["s1"]
    issuer = alice_client.get("/.well-known/oauth-authorization-server").json()["issuer"]
    assert query["iss"] == [issuer]
    assert not Grant.objects.exists()


def test_a_scope_named_twice_is_granted_once(cast, alice_client):
    client_id = register(alice_client)
    page = open_consent(alice_client, client_id, scope="memory memory")
    code = code_from(allow(alice_client, page, agent="new", new_agent="desk"))

    issued = exchange(alice_client, client_id, code)

    assert issued.status_code == 200, issued.content
    assert issued.json()["scope"] == "memory"


def test_a_replayed_refresh_token_is_logged_with_its_connection_revoked(cast, alice_client, caplog):
    """review146: a reused code logged "tokens revoked"; a replayed refresh token
    revoked the connection without a word, the likeliest sign of a stolen one."""
    import logging

    client_id = register(alice_client)
    code = code_from(allow(alice_client, open_consent(alice_client, client_id), agent="new"))
    first = exchange(alice_client, client_id, code).json()["refresh_token"]

    def refresh(token: str):
        return alice_client.post(
            "/oauth/token/",
            {"grant_type": "refresh_token", "refresh_token": token, "client_id": client_id},
        )

    assert refresh(first).status_code == 200
    with caplog.at_level(logging.WARNING, logger="oauth"):
        replayed = refresh(first)

    assert (replayed.status_code, replayed.json()["error"]) == (400, "invalid_grant")
    said = [r for r in caplog.records if r.getMessage() == "oauth: tokens revoked"]
    assert said and "used after a newer one replaced it" in said[-1].reason
    assert first not in caplog.text


def test_a_refresh_token_of_a_disconnected_app_is_refused_without_a_theft_warning(
    cast, alice_client, caplog
):
    """review148: the replay warning fired for any revoked token, a connection the
    user ended included, at every retry of its client."""
    import logging

    from oauth.models import RefreshToken

    client_id = register(alice_client)
    code = code_from(allow(alice_client, open_consent(alice_client, client_id), agent="new"))
    token = exchange(alice_client, client_id, code).json()["refresh_token"]
    RefreshToken.revoke_family(RefreshToken.objects.get().token_family)

    with caplog.at_level(logging.WARNING, logger="oauth"):
        refused = alice_client.post(
            "/oauth/token/",
            {"grant_type": "refresh_token", "refresh_token": token, "client_id": client_id},
        )

    assert (refused.status_code, refused.json()["error"]) == (400, "invalid_grant")
    assert not [r for r in caplog.records if r.getMessage() == "oauth: tokens revoked"]


def test_the_consent_page_is_never_cached(cast, alice_client):
    page = open_consent(alice_client, register(alice_client))

    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
