"""Every HTML page is sent a strict Content-Security-Policy (core/csp.py); JSON answers none.

The policy admits no inline script or style, so the templates may hold none:
what the pages run is a static file, dashboard/static/dashboard/recall.js.
Two pages may send their forms on elsewhere: the consent page to the client's
redirect URI (oauth/tests/test_consent_page.py) and the plan page to Stripe
(dashboard/tests/test_plan_page.py). The browser tests check that no page
breaks the policy and that their scripts still run.
"""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import Client

from core import csp
from dashboard.tests.conftest import ADMIN_PAGES, DASHBOARD_PAGES

HEADER = "Content-Security-Policy"
# An inline <script> (one without src), a <style> block, an on* handler or a style attribute.
INLINE = re.compile(r"<script(?![^>]*\ssrc=)[^>]*>|<style[\s>]|\son[a-z]+\s*=|\sstyle\s*=", re.I)


def directives(header: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (part.split() for part in header.split(";"))}


def test_the_policy_allows_this_server_only_and_nothing_inline():
    # No script-src or style-src: both fall back to default-src, 'self' without
    # 'unsafe-inline', so inline scripts, handlers and styles are all refused.
    assert directives(csp.POLICY) == {
        "default-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }


@pytest.mark.parametrize("path", ["/login/", "/password_reset/", "/admin/login/", "/no-such-page/"])
def test_pages_for_anyone_carry_the_policy(db, client, path):
    response = client.get(path)

    assert response["Content-Type"].startswith("text/html")
    assert response[HEADER] == csp.POLICY


def test_the_dashboard_and_the_admin_carry_the_policy(cast):
    cast.alice.is_staff = cast.alice.is_superuser = True
    cast.alice.save(update_fields=["is_staff", "is_superuser"])
    browser = Client()
    browser.force_login(cast.alice)

    for path in DASHBOARD_PAGES + ADMIN_PAGES:
        response = browser.get(path)
        assert response.status_code == 200, path
        assert response[HEADER] == csp.POLICY, path


@pytest.mark.parametrize("path", ["/.well-known/oauth-authorization-server", "/api/keys"])
def test_json_answers_carry_no_policy(db, client, path):
    response = client.get(path)

    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    assert HEADER not in response


def test_no_template_holds_inline_script_or_style():
    roots = [settings.BASE_DIR / "templates"] + [
        settings.BASE_DIR / app / "templates"
        for app in ("accounts", "billing", "dashboard", "oauth")
    ]
    found = [
        f"{path.relative_to(settings.BASE_DIR)}:{number}: {line.strip()}"
        for root in roots
        for path in sorted(root.rglob("*.html"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if INLINE.search(line)
    ]

    assert found == []


@pytest.mark.parametrize(
    ("uri", "source"),
    [
        ("http://127.0.0.1:33418/callback", "http://127.0.0.1:33418"),
        ("http://localhost/callback?x=1", "http://localhost"),
        ("https://Claude.ai/api/mcp/auth_callback", "https://claude.ai"),
        ("https://app.example.com:8443/cb", "https://app.example.com:8443"),
        # Chromium ignores an IPv6 literal as a source, and matches a private-use
        # scheme only by scheme: these are as narrow as it allows.
        ("http://[::1]:33418/callback", "http:"),
        ("cursor://anysphere.cursor-retrieval/oauth/callback", "cursor:"),
        ("com.example.app:/oauth2redirect", "com.example.app:"),
        # Never a destination; nothing a header could be split by.
        ("javascript:alert(1)", None),
        ("data:text/html,hi", None),
        ("https://a;script-src/cb", None),
        ("", None),
    ],
)
def test_a_destination_is_allowed_as_narrowly_as_the_browser_can_match_it(uri, source):
    assert csp.source(uri) == source


def test_allowing_a_destination_changes_form_action_alone():
    response = HttpResponse()
    csp.allow_form_action(response, "http://127.0.0.1:33418/callback", "javascript:x")

    allowed = directives(response[HEADER])
    assert allowed.pop("form-action") == ["'self'", "http://127.0.0.1:33418"]
    assert allowed == {k: v for k, v in directives(csp.POLICY).items() if k != "form-action"}
