"""The token endpoint answers every refusal in JSON (RFC 6749 section 5.2), its own and Django's.

A client parses the body by its type; an HTML or plain-text page is no answer
it can read, and an error-level log line any caller can write is noise.
"""

from __future__ import annotations

import logging

import pytest


def test_too_many_form_fields_is_a_json_invalid_request_and_no_error_log(db, client, caplog):
    fields = {f"f{i}": "x" for i in range(5000)}

    with caplog.at_level(logging.WARNING):
        refused = client.post("/oauth/token/", {"grant_type": "authorization_code", **fields})

    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/json"
    assert refused["Cache-Control"] == "no-store"
    assert refused.json()["error"] == "invalid_request"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("path", ["/oauth/token/", "/oauth/register/", "/oauth/revoke/"])
def test_a_get_is_a_json_405(db, client, path):
    refused = client.get(path)

    assert refused.status_code == 405
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["error"] == "invalid_request"
    assert "POST" in refused["Allow"]
