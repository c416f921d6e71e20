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


def _security_records(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == f"django.security.{name}"]


def test_a_refusal_any_client_can_provoke_is_a_warning_without_frames(client, caplog):
    """A Host outside ALLOWED_HOSTS, or a form of too many fields, logs one warning: at
    error level with its frames, a client could fill the error log with a loop."""
    caplog.set_level(logging.INFO)

    assert client.get("/login/", HTTP_HOST="evil.example").status_code == 400
    fields = {f"f{n}": "x" for n in range(1_500)}
    assert client.post("/login/", fields).status_code == 400

    for name in ("DisallowedHost", "TooManyFieldsSent"):
        [record] = _security_records(caplog, name)
        assert record.levelname == "WARNING"
        assert record.levelno == logging.WARNING
        assert record.exc_info is None
        assert "Traceback" not in ConsoleFormatter().format(record)
        assert '"level": "warning"' in JsonFormatter().format(record)
