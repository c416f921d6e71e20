"""The tool adapters: errors become error results, and no exception text escapes."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection, transaction

from accounts import auth
from memories import services
from memories.mcp import tools


@pytest.fixture
def as_alice(cast):
    token = auth.current.set(
        auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    )
    yield cast
    auth.current.reset(token)


def payload(result) -> dict:
    return result.structured_content


def test_a_service_error_becomes_an_error_result(as_alice):
    result = tools.update_memory(id="00000000-0000-4000-8000-000000000000", metadata={})
    assert result.is_error
    assert payload(result)["error"]["code"] == "not_found"
    assert json.loads(result.content[0].text) == payload(result)


def test_an_unexpected_failure_is_an_internal_error_without_its_text(as_alice, monkeypatch, caplog):
    def explode(**kwargs):
        raise RuntimeError("connection to db failed; password=hunter2; content=top secret")

    monkeypatch.setattr(services, "recall", explode)
    with caplog.at_level(logging.ERROR, logger="memories.tools"):
        result = tools.recall(query="anything")

    assert payload(result) == {
        "error": {
            "code": "internal_error",
            "message": "Something went wrong on our side. Try again shortly.",
        }
    }
    record = caplog.records[-1]
    assert record.exc_type == "builtins.RuntimeError"
    assert "hunter2" not in caplog.text and "top secret" not in caplog.text


def test_a_database_failure_is_logged_with_its_sqlstate_but_not_its_text(
    as_alice, monkeypatch, caplog
):
    def fail(**kwargs):
        # PostgreSQL quotes the value it could not read in its message.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::integer", ["top secret"])

    monkeypatch.setattr(services, "recall", fail)
    with caplog.at_level(logging.ERROR, logger="memories.tools"):
        result = tools.recall(query="anything")

    assert payload(result)["error"]["code"] == "internal_error"
    record = caplog.records[-1]
    assert record.exc_type == "django.db.utils.DataError"
    assert record.sqlstate == "22P02"  # invalid_text_representation
    # Below it, only Django's and psycopg's frames: the origin is our call.
    assert "memories/tests/test_tools.py:" in record.origin
    assert record.origin.endswith(" in fail")
    assert "top secret" not in caplog.text


def test_a_call_without_a_caller_is_refused(db):
    result = tools.list_memories()
    assert payload(result)["error"]["code"] == "internal_error"


def test_forget_explains_what_each_mode_needs(as_alice):
    by_id = tools.forget(mode="by_id")
    by_query = tools.forget(mode="by_query")
    assert "needs the id" in payload(by_id)["error"]["message"]
    assert "needs a query" in payload(by_query)["error"]["message"]


def test_recall_text_is_memory_tags_and_structured_content_is_an_object(as_alice):
    tools.remember(content="The user's favourite colour is teal.")
    result = tools.recall(query="favourite colour")
    assert result.content[0].text.startswith("<memory id=")
    assert payload(result)["count"] == 1
    empty = tools.recall(query="favourite colour", namespace="elsewhere")
    assert empty.content[0].text == "No memories matched this query."
