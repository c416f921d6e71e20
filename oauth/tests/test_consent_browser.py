"""The consent page in Chromium, at a laptop's width (1366 px) and a phone's (390 px).

It is measured, not only photographed: the new agent's name box is wide
enough to read what it holds, each radio button is a radio button's size
at the left of its line, nothing is wider than the window, and Allow is in
reach. Allow without typing connects, as the client's own name, and the
redirect to the client that answers it is not refused by the page's
form-action (core/csp.py); nothing else on the way breaks the policy either.
Screenshots: artifacts/screenshots/consent-1366.png and consent-390.png.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx2
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from accounts.models import Agent
from core import tenancy
from oauth import tokens
from oauth.models import Grant
from tests.browser import (
    DESKTOP,
    PHONE,
    chromium,
    csp_violations,
    new_page,
    out_of_view,
    overflow,
    shoot,
    sign_in,
)
from tests.consent import CHALLENGE, VERIFIER
from tests.oauth_servers import Callback
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-consent-password-1"
CLIENT_NAME = "Layout Tester"


@pytest.fixture
def server(transactional_db) -> Iterator[LiveServer]:
    with LiveServer() as live:
        yield live


@pytest.fixture
def callback() -> Iterator[Callback]:
    catcher = Callback()
    yield catcher
    catcher.close()


def authorize_url(server: LiveServer, client_id: str, redirect_uri: str) -> str:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": "layout",
        "scope": "memory",
        "code_challenge": challenge.rstrip(b"=").decode(),
        "code_challenge_method": "S256",
        "resource": server.url + "/agent/mcp",
    }
    return f"{server.url}/oauth/authorize/?{urlencode(params)}"


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, selector
    return dict(found)


def measure(page: Any) -> dict[str, Any]:
    fieldset = box(page, ".agent-choice")
    radios = [
        dict(r)
        for r in page.locator(".agent-choice input[type=radio]").evaluate_all(
            "els => els.map(e => { const b = e.getBoundingClientRect();"
            " return {x: b.x, y: b.y, width: b.width, height: b.height}; })"
        )
    ]
    label = page.locator("label[for=agent-new]").evaluate(
        "el => { const r = document.createRange(); r.selectNodeContents(el);"
        " const rects = [...r.getClientRects()].filter(b => b.width > 0);"
        " const b = rects[rects.length - 1]; return {y: b.y, height: b.height}; }"
    )
    return {
        "fieldset": fieldset,
        "radios": radios,
        "name_box": box(page, "#id_new_agent"),
        "new_radio": box(page, "#agent-new"),
        "label": label,
    }


def sign_up_and_register(cast: Any, server: LiveServer, callback: Callback) -> str:
    """Give Alice a password and register a public client at ``callback``; its client id."""
    cast.alice.password = PBKDF2PasswordHasher().encode(PASSWORD, "consentbrowsersalt")
    cast.alice.save(update_fields=["password"])
    registered = httpx2.post(
        f"{server.url}/oauth/register/",
        json={
            "client_name": CLIENT_NAME,
            "redirect_uris": [callback.url],
            "token_endpoint_auth_method": "none",
        },
        timeout=30,
    )
    assert registered.status_code == 201, registered.text
    return str(registered.json()["client_id"])


def test_the_consent_page_holds_its_layout_at_laptop_and_phone_widths(cast, server, callback):
    client_id = sign_up_and_register(cast, server, callback)

    seen: dict[int, dict[str, Any]] = {}
    violations: list[list[str]] = []  # each page's
    with chromium() as browser:
        # A refused request, before any sign-in: an error page, as readable on a phone.
        page = new_page(browser, PHONE)
        violations.append(csp_violations(page))
        page.goto(authorize_url(server, client_id, "https://evil.example/callback"))
        refused = {
            "reason": page.locator("[data-refusal]").get_attribute("data-refusal"),
            "password_form": page.locator("#id_password").count(),
            "overflow": overflow(page),
        }
        shoot(page, "consent-refused-390")
        page.context.close()

        for viewport in (PHONE, DESKTOP):
            page = new_page(browser, viewport)
            violations.append(csp_violations(page))
            page.goto(authorize_url(server, client_id, callback.url))
            sign_in(page, "alice@example.com", PASSWORD)
            page.wait_for_selector("#authorizationForm")
            shoot(page, f"consent-{viewport['width']}")
            seen[viewport["width"]] = {
                **measure(page),
                "overflow": overflow(page),
                "out_of_view": out_of_view(page, ".consent-actions .btn, [data-switch-account]"),
                "account": page.locator("[data-account]").inner_text(),
                "name": page.input_value("#id_new_agent"),
                "new_checked": page.is_checked("#agent-new"),
            }
            # Going to the name box picks "a new agent" (recall.js); then back to the page's choice.
            chosen = page.locator(".agent-choice input:checked").get_attribute("value")
            page.focus("#id_new_agent")
            seen[viewport["width"]]["focus_picks_new"] = page.is_checked("#agent-new")
            page.check(f".agent-choice input[value='{chosen}']")
            # Allow at once, whatever the page chose.
            page.click("button[name=allow]")
            query = callback.wait()
            assert query.get("code") and query.get("state") == "layout", query
            page.context.close()

    assert refused == {"reason": "unregistered_redirect_uri", "password_form": 0, "overflow": 0}
    assert violations == [[], [], []]
    for width, facts in seen.items():
        assert facts["overflow"] <= 0, (width, facts["overflow"])
        assert facts["out_of_view"] == [], (width, facts["out_of_view"])
        assert facts["account"] == "alice@example.com"
        assert facts["focus_picks_new"], width
        # The name box is wide enough to show a name: the bug left it 20 px wide.
        assert facts["name_box"]["width"] >= 200, (width, facts["name_box"])
        # Radios are radio-sized, at the left edge of the choices, beside their label.
        fieldset = facts["fieldset"]
        for radio in facts["radios"]:
            assert radio["width"] <= 24, (width, radio)
            assert radio["x"] - fieldset["x"] <= 30, (width, radio, fieldset)
        radio_middle = facts["new_radio"]["y"] + facts["new_radio"]["height"] / 2
        label_middle = facts["label"]["y"] + facts["label"]["height"] / 2
        assert abs(radio_middle - label_middle) <= 6, (width, facts["new_radio"], facts["label"])

    # The first time (at 390 px), a new agent named after the client, filled in and chosen;
    # the second time, that agent is the one chosen.
    assert seen[390]["new_checked"] and seen[390]["name"] == CLIENT_NAME
    assert not seen[1366]["new_checked"] and seen[1366]["name"] == ""
    with tenancy.tenant(cast.alice.id):
        agent = Agent.objects.get(user=cast.alice, name=CLIENT_NAME)
    assert list(Grant.objects.values_list("agent_id", flat=True)) == [agent.id, agent.id]


def test_a_returning_client_goes_from_sign_in_straight_to_its_callback(cast, server, callback):
    # approval_prompt=auto from a client the user is connected to skips the
    # consent page (oauth/views.py), so the sign-in form's redirects end at the
    # client: a form-action that allowed only this server would stop them there.
    client_id = sign_up_and_register(cast, server, callback)
    request = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": callback.url,
        "state": "again",
        "scope": "memory",
        "code_challenge": CHALLENGE,
        "code_challenge_method": "S256",
        "resource": server.url + "/agent/mcp",
        "approval_prompt": "auto",
    }
    url = f"{server.url}/oauth/authorize/?{urlencode(request)}"

    def token_for(code: str) -> str:
        issued = httpx2.post(
            f"{server.url}/oauth/token/",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": callback.url,
                "client_id": client_id,
                "code_verifier": VERIFIER,
            },
            timeout=30,
        )
        assert issued.status_code == 200, issued.text
        return str(issued.json()["access_token"])

    with chromium() as browser:
        # The first time, there is no connection to go on with: the page asks.
        page = new_page(browser, DESKTOP)
        violations = csp_violations(page)
        page.goto(url)
        sign_in(page, "alice@example.com", PASSWORD)
        page.click("button[name=allow]")
        first = token_for(callback.wait()["code"])
        page.context.close()

        # Signed out, later: signing in leads straight on to the client.
        page = new_page(browser, DESKTOP)
        violations += csp_violations(page)
        page.goto(url)
        sign_in(page, "alice@example.com", PASSWORD)
        returned = callback.wait()
        landed = page.url
        page.context.close()

    assert violations == []
    assert landed.startswith(callback.url + "?code=")
    # Looked up outside the browser's event loop, where the ORM may run.
    before, after = tokens.look_up(first), tokens.look_up(token_for(returned["code"]))
    assert before is not None and after is not None
    assert after.agent_id == before.agent_id


def test_enter_in_the_new_agents_name_box_allows_the_connection(cast, server, callback):
    # Cancel came first in the form, so Enter in the name box (a form's
    # implicit submission takes its first submit button) refused the client.
    client_id = sign_up_and_register(cast, server, callback)
    with chromium() as browser:
        page = new_page(browser, DESKTOP)
        page.goto(authorize_url(server, client_id, callback.url))
        sign_in(page, "alice@example.com", PASSWORD)
        # Shown as before: Cancel, then Allow at the right.
        allow, cancel = box(page, "button[name=allow]"), box(page, ".consent-actions .btn >> nth=1")
        page.fill("#id_new_agent", "Typed then Enter")
        page.press("#id_new_agent", "Enter")
        answered = callback.wait()
        page.context.close()

    assert cancel["x"] + cancel["width"] <= allow["x"]
    assert "code" in answered and "error" not in answered, answered
    with tenancy.operator():
        assert Agent.objects.filter(user=cast.alice, name="Typed then Enter").exists()
