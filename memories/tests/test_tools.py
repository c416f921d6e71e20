"""The tool adapters: errors become error results, and no exception text escapes."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection, transaction
from psycopg import errors as psycopg_errors

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


def lost_race(sqlstate_error: type[Exception]) -> Exception:
    """What Django raises when PostgreSQL rolls a transaction back to settle a race."""
    from django.db import utils

    error = utils.OperationalError("deadlock detected")
    error.__cause__ = sqlstate_error("deadlock detected")
    return error


@pytest.fixture
def alice_outside_a_transaction(transactional_db, cast):
    token = auth.current.set(
        auth.AuthContext(user_id=cast.alice.id, api_key_id=cast.alice_key.key.id, tier="free")
    )
    yield cast
    auth.current.reset(token)


@pytest.mark.parametrize(
    "lost", [psycopg_errors.DeadlockDetected, psycopg_errors.SerializationFailure]
)
def test_a_call_that_lost_a_race_runs_again_and_writes_once(
    alice_outside_a_transaction, monkeypatch, lost
):
    real = services.remember
    calls = []

    def racing(**kwargs):
        calls.append(kwargs)
        with transaction.atomic():
            done = real(**kwargs)
            if len(calls) == 1:  # rolled back with what it wrote
                raise lost_race(lost)
        return done

    monkeypatch.setattr(services, "remember", racing)
    result = tools.remember(content="The office wifi password is tulip-42.")

    assert not result.is_error, payload(result)
    assert len(calls) == 2
    listed = payload(tools.list_memories())
    assert [m["id"] for m in listed["memories"]] == [payload(result)["id"]]


def test_a_call_that_keeps_losing_is_a_conflict_to_retry(alice_outside_a_transaction, monkeypatch):
    calls = []

    def racing(**kwargs):
        calls.append(kwargs)
        raise lost_race(psycopg_errors.DeadlockDetected)

    monkeypatch.setattr(services, "recall", racing)
    result = tools.recall(query="anything")

    assert len(calls) == 3
    error = payload(result)["error"]
    assert error["code"] == "conflict"
    assert "Make the call again" in error["message"]


def test_other_database_errors_run_once(alice_outside_a_transaction, monkeypatch):
    calls = []

    def failing(**kwargs):
        calls.append(kwargs)
        raise lost_race(psycopg_errors.UniqueViolation)

    monkeypatch.setattr(services, "recall", failing)
    assert payload(tools.recall(query="anything"))["error"]["code"] == "internal_error"
    assert len(calls) == 1
