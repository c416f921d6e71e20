"""Every `recall` command that needs the database says in one line that it cannot reach it."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection

from recall import unreachable
from tests.support import free_port

PASSWORD = "hunter2-secret"  # for a server that is not there: it must never be echoed


def recall_command(*args: str, tmp_path, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "RECALL_API_KEY"}}
    env.update(
        DATABASE_URL=f"postgres://nobody:{PASSWORD}@127.0.0.1:{free_port()}/nope",
        SECRET_KEY="x",
        API_KEY_SECRET="y",
        RECALL_DATA_DIR=str(tmp_path),
        **environment,
    )
    return subprocess.run(
        [sys.executable, "-m", "recall", *args],
        cwd=settings.BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "environment"),
    [
        (["serve"], {}),
        (["list-keys"], {}),
        (["create-user", "alice@example.com"], {}),
        (["manage", "migrate"], {}),
        (["worker"], {}),
        # A well-formed key, which start-up looks up, and a mistyped one, which it
        # refuses unread, then asks the database why (recall/stdio.py, refused_key).
        (["stdio"], {"RECALL_API_KEY": "recall_live_" + "a" * 32}),
        (["stdio"], {"RECALL_API_KEY": "recall_live_mistyped"}),
    ],
    ids=["serve", "list-keys", "create-user", "manage", "worker", "stdio", "stdio-mistyped-key"],
)
def test_an_unreachable_database_is_one_line_naming_database_url(tmp_path, args, environment):
    result = recall_command(*args, tmp_path=tmp_path, **environment)

    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"recall {args[0]}: cannot reach the database in DATABASE_URL (connection refused):"
        " check its host, port, user and password, and that the server is up."
    ]
    assert PASSWORD not in result.stderr + result.stdout


def test_the_reason_is_what_postgresql_or_the_network_said(settings):
    settings.EMBEDDED_DATABASE = False
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(
            f"host=127.0.0.1 port={free_port()} user=x password={PASSWORD} dbname=x",
            connect_timeout=5,
        )

    said = unreachable.describe(refused.value)

    assert said is not None
    assert said.startswith("cannot reach the database in DATABASE_URL (connection refused):")
    assert PASSWORD not in said


@pytest.mark.django_db
def test_a_query_that_fails_is_not_called_unreachable():
    with pytest.raises(DatabaseError) as failed, connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")

    assert unreachable.describe(failed.value) is None


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_statement_is_unavailable_to_retry_not_an_internal_error():
    # SQLSTATE 57014 (a statement_timeout, an operator's pg_cancel_backend) was
    # "internal_error", logged as a fault of ours; the same call again passes.
    from django.db import transaction

    from core import errors

    with (
        pytest.raises(DatabaseError) as cancelled,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET LOCAL statement_timeout = '10ms'")
        cursor.execute("SELECT pg_sleep(1)")

    said = errors.from_exception(cancelled.value)
    assert said.code == "unavailable"
    assert "Retry" in said.message
    assert unreachable.describe(cancelled.value) is None  # not the database gone


def test_a_psycopg_error_from_the_start_up_is_one_line(monkeypatch, capsys):
    # The embedded server's start-up connects with psycopg before Django does:
    # its error escaped as a traceback.
    from recall import cli

    def start_up_fails(command, rest):
        raise psycopg.OperationalError("connection timeout expired")

    monkeypatch.setattr(cli, "_run", start_up_fails)
    with pytest.raises(SystemExit) as ended:
        cli.main(["list-keys"])

    assert ended.value.code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("recall list-keys: cannot reach the")
    assert "(connection timeout expired)" in line


@pytest.mark.django_db(transaction=True)
def test_a_tool_call_whose_statement_is_cancelled_is_no_outage_in_the_log(caplog):
    # Answered unavailable, it was logged as the database going away
    # ("database unavailable", once per outage) and not as this tool's.
    import logging

    from django.db import transaction

    from memories.mcp import runtime

    def cancelled_body():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '10ms'")
            cursor.execute("SELECT pg_sleep(1)")

    with caplog.at_level(logging.INFO):
        result = runtime._run("recall", cancelled_body, runtime.failure)

    assert result.is_error and result.structured_content["error"]["code"] == "unavailable"
    [line] = [r for r in caplog.records if r.getMessage() == "statement cancelled by the database"]
    assert (line.levelname, line.tool) == ("WARNING", "recall")
    assert "database unavailable" not in caplog.text
