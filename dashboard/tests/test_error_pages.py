"""The error pages: in the site's layout, with a way back, and no talk of debugging."""

from __future__ import annotations

import uuid

from django.template import loader
from django.test import Client, RequestFactory
from django.views import defaults


def test_an_unknown_memorys_history_is_a_404_in_the_sites_layout(cast, alice_client):
    response = alice_client.get(f"/memories/{uuid.uuid4()}/history/")

    text = response.content.decode()
    assert response.status_code == 404
    assert "<h1>Not found</h1>" in text
    assert "dashboard/recall.css" in text
    assert 'href="/"' in text and "Back to your dashboard" in text


def test_a_sign_in_without_its_csrf_cookie_is_refused_in_plain_words(cast):
    browser = Client(enforce_csrf_checks=True)

    response = browser.post("/login/", {"username": "alice@example.com", "password": "x"})

    text = response.content.decode()
    assert response.status_code == 403
    assert "That form could not be sent" in text
    assert "dashboard/recall.css" in text
    assert 'href="/login/"' in text
    assert "DEBUG" not in text and "CSRF verification failed" not in text


def test_the_403_page_offers_a_way_back(cast, alice_client):
    request = RequestFactory().get("/somewhere/")
    request.user = cast.alice

    response = defaults.permission_denied(request, PermissionError())

    text = response.content.decode()
    assert response.status_code == 403
    assert "<h1>Not allowed</h1>" in text and "Back to your dashboard" in text


def test_the_500_page_needs_no_request_and_no_database():
    # Django renders it with no context at all; the failure may be the database's.
    # No db fixture: a query here would raise.
    response = defaults.server_error(RequestFactory().get("/"))
    text = loader.get_template("500.html").render()

    assert response.status_code == 500
    assert "Something went wrong" in response.content.decode()
    assert 'href="/"' in text and "dashboard/recall.css" in text
    assert "DEBUG" not in text and "Traceback" not in text
