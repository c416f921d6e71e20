"""Every dashboard page at a phone's width (390 px), in Chromium, with data in it.

Each page is measured: nothing is wider than the window (the page's
scrollWidth against the window's width), and every link of the navigation
is on screen. Long content is there on purpose: a URL with no break in it,
metadata, a long namespace, several keys, an agent, a connected app, usage
by agent. No page breaks its Content-Security-Policy (usage's bar and
legend are drawn without inline style). Screenshots: artifacts/screenshots/phone-*.png.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from conftest import issue_key
from dashboard.tests.conftest import record
from oauth.models import Application, RefreshToken
from tests.browser import (
    PHONE,
    chromium,
    csp_violations,
    new_page,
    out_of_view,
    overflow,
    shoot,
    sign_in,
)
from tests.support import LiveServer, store_memory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-phone-password-1"
LONG_URL = "https://docs.example.com/" + "runbooks-and-more-" * 12 + "deploy"
NAV = "nav.nav a"


@pytest.fixture
def server(transactional_db) -> Iterator[LiveServer]:
    with LiveServer() as live:
        yield live


@pytest.fixture
def filled(cast, agents) -> dict[str, str]:
    """Alice's account with something on every page; returns the memory whose history to show."""
    cast.alice.password = PBKDF2PasswordHasher().encode(PASSWORD, "phonewidthsalt")
    cast.alice.save(update_fields=["password"])
    memory = store_memory(
        cast.alice,
        f"Deploy notes for the payments service live at {LONG_URL}",
        agent=agents.research,
        metadata={"source": "slack", "url": LONG_URL, "tags": ["deploy", "payments"]},
    )
    store_memory(cast.alice, "A user-wide note.")
    store_memory(cast.alice, "Elsewhere.", namespace="projects/payments-service-migration-2026")
    # The longest namespace there is, with no break in it.
    store_memory(cast.alice, "Far away.", namespace="n" * 64)
    issue_key(cast.alice, "k" * 100)
    for tool, agent in (("remember", agents.research), ("recall", agents.writer), ("recall", None)):
        record(cast.alice, tool, agent=agent)
    # A tool name is the client's to send: the longest kept, with no break in it.
    record(cast.alice, "T" * 64)
    application = Application.objects.create(
        name="Phone Test Client With A Rather Long Name",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://127.0.0.1:33418/callback",
        registration_source=Application.RegistrationSource.DCR,
    )
    RefreshToken.objects.create(
        user=cast.alice,
        application=application,
        token="",
        token_checksum=hashlib.sha256(b"phone-refresh").hexdigest(),
        token_family=uuid.uuid4(),
        agent=agents.research,
    )
    return {"memory": str(memory.id)}


def facts(page: Any) -> dict[str, Any]:
    return {
        "overflow": overflow(page),
        "links": page.locator(NAV).count(),
        "off_screen": out_of_view(page, f"{NAV}, .segmented a, .page-head .btn"),
    }


def test_every_page_fits_a_phone_and_keeps_the_navigation_in_reach(server, filled):
    pages = {
        "usage": "/usage/",
        "usage-7-days": "/usage/?days=7",
        "keys": "/keys/",
        "agents": "/agents/",
        "connections": "/connections/",
        "memories": "/memories/",
        "memories-search": "/memories/?q=deploy+payments",
        "memories-namespace": "/memories/?namespace=projects/payments-service-migration-2026",
        "memories-long-namespace": "/memories/?namespace=" + "n" * 64,
        "history": f"/memories/{filled['memory']}/history/",
        "changes": "/memories/changes/",
        "plan": "/plan/",
        "password-change": "/password_change/",
    }
    seen: dict[str, dict[str, Any]] = {}
    with chromium() as browser:
        page = new_page(browser, PHONE)
        violations = csp_violations(page)
        for name, path in (("sign-in", "/login/"), ("password-reset", "/password_reset/")):
            page.goto(server.url + path)
            seen[name] = {**facts(page), "links": None}
            shoot(page, f"phone-{name}")
        page.goto(server.url + "/login/")
        sign_in(page, "alice@example.com", PASSWORD)
        for name, path in pages.items():
            page.goto(server.url + path)
            seen[name] = facts(page)
            shoot(page, f"phone-{name}")

        # A new key, shown once with its client snippets.
        page.goto(server.url + "/keys/")
        page.fill("#id_name", "phone")
        page.click("button:has-text('Create key')")
        page.wait_for_selector("#new-key")
        seen["keys-new-key"] = facts(page)
        shoot(page, "phone-keys-new-key")

        # The navigation works by touch, too: its last link is on screen and goes there.
        page.goto(server.url + "/usage/")
        page.click(f"{NAV} >> text=Plan")
        page.wait_for_url(server.url + "/plan/")
        tables_stacked = page.locator("table.stack thead").evaluate_all(
            "heads => heads.every(h => getComputedStyle(h).display === 'none')"
        )
        # Wider than a phone, where tables are tables: a key's name with no
        # break in it made the keys page scroll sideways.
        page.set_viewport_size({"width": 1000, "height": 800})
        page.goto(server.url + "/keys/")
        seen["keys-1000px"] = facts(page)

    for name, found in seen.items():
        assert found["overflow"] <= 0, (name, found)
        assert found["off_screen"] == [], (name, found)
        if found["links"] is not None:
            assert found["links"] == 6, (name, found)
    assert tables_stacked
    assert violations == []
