"""A NUL character in a request's parameters is refused with 400, never a 500.

PostgreSQL stores no NUL; a lookup with one failed in the driver, and the
OAuth endpoints (open to anyone) and the admin's filters answered 500 and
logged an error for each such request.
"""

from __future__ import annotations

import logging

import pytest


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("get", "/oauth/authorize/?client_id=%00&response_type=code", None),
        ("post", "/oauth/token/", {"client_id": "\x00", "grant_type": "authorization_code"}),
        ("post", "/oauth/revoke/", {"client_id": "\x00", "token": "x"}),
        ("get", "/login/?next=/%00", None),
    ],
)
def test_anyone_sending_a_nul_gets_400(db, client, caplog, method, path, data):
    with caplog.at_level(logging.ERROR):
        response = getattr(client, method)(path, data=data) if data else client.get(path)

    assert response.status_code == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "path",
    [
        "/admin/memories/memory/?ns=%00",
        "/admin/accounts/user/?tier=%00",
        "/admin/billing/usageevent/?user_email=%00",
        "/admin/billing/subscription/%00/change/",
    ],
)
def test_a_nul_in_an_admin_filter_gets_400(cast, admin_client, path):
    assert admin_client.get(path).status_code == 400


def test_a_form_without_nul_is_served_as_before(db, client):
    response = client.post("/oauth/token/", {"client_id": "nobody", "grant_type": "password"})

    assert response.status_code in (400, 401)
    assert "NUL" not in response.content.decode()


@pytest.mark.parametrize("path", ["/oauth/token/", "/oauth/revoke/"])
def test_an_oauth_program_endpoint_says_it_in_oauths_own_json(db, client, path):
    """review135: curl's Accept */* got the dashboard's plain text on these paths."""
    form = "grant_type=authorization_code&code=%00&token=%00"
    kind = "application/x-www-form-urlencoded"
    response = client.post(path, form, content_type=kind, HTTP_ACCEPT="*/*")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "error": "invalid_request",
        "error_description": "Request parameters must not contain NUL characters.",
    }
