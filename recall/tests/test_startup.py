"""Start-up (`recall.startup.prepare`): processes starting together do its steps one at a time."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from accounts import auth
from accounts.models import User
from memories import embeddings, indexes
from recall import startup
from tests.support import database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

APPLICATION_NAME = "recall-startup-test"

PREPARE = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from recall import startup
    startup.prepare(sys.stderr)
    """
)


def start_prepare() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PREPARE],
        cwd=settings.BASE_DIR,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "recall.settings",
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "API_KEY_SECRET": settings.API_KEY_SECRET,
            "PGAPPNAME": APPLICATION_NAME,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def both_waiting(watcher: psycopg.Connection) -> bool:
    """Whether one start-up process waits for a lock (the table) while the other asks
    for the start-up lock again and again (``pooling.advisory_lock`` polls)."""
    row = watcher.execute(
        "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
        " count(*) FILTER (WHERE state = 'idle' AND query LIKE 'SELECT pg_try_advisory_lock(%%')"
        " FROM pg_stat_activity WHERE application_name = %s",
        [APPLICATION_NAME],
    ).fetchone()
    return bool(row and row[0] >= 1 and row[1] >= 1)


def test_two_processes_starting_at_once_create_the_vector_index_once(cast):
    # The HNSW index is missing, as after switching embedding models.
    model_id, dimensions = embeddings.model_spec()
    indexes.drop_vector_index(model_id)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    blocker = psycopg.connect(**params)
    watcher = psycopg.connect(**params, autocommit=True)
    first = second = None
    try:
        # Hold the table, so that both processes reach the index while the
        # other one is still starting: the interleaving that used to fail.
        blocker.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
        first, second = start_prepare(), start_prepare()
        deadline = time.monotonic() + 120
        while not both_waiting(watcher):
            assert first.poll() is None and second.poll() is None, "a process ended early"
            assert time.monotonic() < deadline, "the processes never both reached the index"
            time.sleep(0.05)
        blocker.rollback()  # both are waiting now: let them go at once

        _, err1 = first.communicate(timeout=120)
        _, err2 = second.communicate(timeout=120)
        assert first.returncode == 0, err1
        assert second.returncode == 0, err2
        assert "UniqueViolation" not in err1 + err2
        assert model_id in indexes.existing_models()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
        blocker.close()
        watcher.close()
        indexes.ensure_vector_index(model_id, dimensions)


def test_a_start_does_not_wait_for_a_write_in_progress_when_the_index_exists(cast):
    # CREATE INDEX IF NOT EXISTS took a share lock on memories before looking:
    # a `recall stdio` or `recall worker` starting then waited for any open
    # write, and every write after it waited for that start.
    model_id, dimensions = embeddings.model_spec()
    indexes.ensure_vector_index(model_id, dimensions)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    writer = psycopg.connect(**params)
    try:
        writer.execute("LOCK TABLE memories IN ROW EXCLUSIVE MODE")  # what an insert holds
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
            try:
                indexes.ensure_vector_index(model_id, dimensions)
            finally:
                cursor.execute("RESET lock_timeout")
    finally:
        writer.close()


def desktop_env(banner: str) -> dict[str, str]:
    start = banner.index("{", banner.index("Claude Desktop"))
    config, _ = json.JSONDecoder().raw_decode(banner, start)
    return config["mcpServers"]["recall"]["env"]


def test_the_first_user_is_unlimited_and_the_banner_says_so_and_where_the_data_is(
    settings, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    settings.RECALL_DATA_DIR = Path("relative-data")  # as RECALL_DATA_DIR=relative would be
    first = startup.bootstrap()
    assert first is not None
    out = io.StringIO()

    startup.announce(first, out)

    banner = out.getvalue()
    user = User.objects.get(email="admin@localhost")
    caller = auth.authenticate(first.api_key)
    assert user.tier == "unlimited" and caller is not None and caller.tier == "unlimited"
    assert "Tier:       Unlimited: no rate limit, no memory quota" in banner
    data_dir = str(tmp_path / "relative-data")
    assert f"Data:       {data_dir}  (RECALL_DATA_DIR)" in banner
    # A desktop client starts the command without the server's environment.
    assert desktop_env(banner) == {"RECALL_API_KEY": first.api_key, "RECALL_DATA_DIR": data_dir}
    assert startup.bootstrap() is None  # once only


def test_the_operator_can_choose_the_first_users_tier(settings):
    settings.RECALL_ADMIN_TIER = "free"

    first = startup.bootstrap()
    assert first is not None
    out = io.StringIO()
    startup.announce(first, out)

    assert User.objects.get(email="admin@localhost").tier == "free"
    assert "Tier:       Free: rate limit 10 per minute, at most 100 memories" in out.getvalue()


def test_with_an_external_database_the_banner_names_the_settings_but_prints_no_secret(settings):
    settings.EMBEDDED_DATABASE = False
    first = startup.bootstrap()
    assert first is not None
    out = io.StringIO()

    startup.announce(first, out)

    banner = out.getvalue()
    assert desktop_env(banner) == {
        "RECALL_API_KEY": first.api_key,
        "DATABASE_URL": "<this server's DATABASE_URL>",
        "SECRET_KEY": "<this server's SECRET_KEY>",
        "API_KEY_SECRET": "<this server's API_KEY_SECRET>",
    }
    assert "Fill in the <...> entries" in banner
    assert settings.SECRET_KEY not in banner and settings.API_KEY_SECRET not in banner
