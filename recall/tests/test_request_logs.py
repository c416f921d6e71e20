"""Django's request logs name the method and path of a refused request, never its query or body.

``django.request`` logs every 4xx and 5xx ("Not Found: /path") and
``django.security`` every suspicious request, each passing the request
object along; its repr holds the query string, where an OAuth ``state``, a
search or a key sent as ``?api_key=`` would be.
"""

from __future__ import annotations

import logging

import pytest

from core.logging import ConsoleFormatter, JsonFormatter

pytestmark = pytest.mark.django_db

SECRET = "recall_live_s3cretQueryValue"
FORMATTERS = pytest.mark.parametrize(
    "formatter", [JsonFormatter(), ConsoleFormatter()], ids=["json", "console"]
)


def logged(caplog: pytest.LogCaptureFixture, formatter: logging.Formatter) -> str:
    return "\n".join(formatter.format(record) for record in caplog.records)


@FORMATTERS
@pytest.mark.parametrize(
    ("url", "event"),
    [
        (
            "/oauth/authorize/?response_type=code&client_id=nobody"
            f"&code_challenge={SECRET}&code_challenge_method=S256&state={SECRET}",
            "Bad Request: /oauth/authorize/",
        ),
        (f"/dashboard/nowhere/?q={SECRET}", "Not Found: /dashboard/nowhere/"),
        (f"/nowhere?api_key={SECRET}", "Not Found: /nowhere"),
    ],
    ids=["oauth-400", "dashboard-404", "api-key-404"],
)
def test_a_refused_get_is_logged_without_its_query(client, caplog, formatter, url, event):
    caplog.set_level(logging.INFO)

    response = client.get(url)

    assert response.status_code in (400, 404)
    logs = logged(caplog, formatter)
    assert SECRET not in logs
    assert event in logs
    assert f"GET {event.split(': ')[1]}" in logs  # the request field: method and path


@FORMATTERS
def test_a_refused_post_is_logged_without_its_query_body_or_credentials(client, caplog, formatter):
    caplog.set_level(logging.INFO)

    response = client.post(
        f"/oauth/token/?code={SECRET}",
        {"grant_type": "authorization_code", "code": SECRET, "code_verifier": SECRET},
        HTTP_AUTHORIZATION=f"Bearer {SECRET}",
    )

    assert 400 <= response.status_code < 500
    logs = logged(caplog, formatter)
    assert SECRET not in logs
    assert "POST /oauth/token/" in logs


@FORMATTERS
def test_a_disallowed_host_is_logged_without_the_query(client, caplog, formatter):
    caplog.set_level(logging.INFO)

    response = client.get(f"/dashboard/?q={SECRET}", HTTP_HOST="evil.example")

    assert response.status_code == 400
    logs = logged(caplog, formatter)
    assert "django.security.DisallowedHost" in logs
    assert SECRET not in logs
