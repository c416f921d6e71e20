"""Settings fail at start-up, naming the variable, when the environment is wrong."""

from __future__ import annotations

import json

import pytest

from tests.support import load_settings


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"HNSW_EF_SEARCH": "lots"}, "HNSW_EF_SEARCH"),
        ({"HNSW_EF_SEARCH": "0"}, "HNSW_EF_SEARCH"),
        ({"OPENAI_TIMEOUT": "-1"}, "OPENAI_TIMEOUT"),
        ({"EMBEDDING_PROVIDER": "cohere"}, "EMBEDDING_PROVIDER"),
        ({"RECALL_DEFAULT_THRESHOLD": "1.5"}, "RECALL_DEFAULT_THRESHOLD"),
        ({"FREE_TIER_MAX_MEMORIES": "ten"}, "FREE_TIER_MAX_MEMORIES"),
        ({"LOG_LEVEL": "verbose"}, "LOG_LEVEL"),
        ({"DATABASE_URL": "mysql://u:p@h/db"}, "DATABASE_URL"),
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        # The embedded PostgreSQL cannot start in such a path (recall/env.py).
        ({"RECALL_DATA_DIR": "/srv/Application Support/recall"}, "RECALL_DATA_DIR"),
        ({"RECALL_DATA_DIR": "/srv/recall;data"}, "RECALL_DATA_DIR"),
        ({"HSTS_SECONDS": "a year"}, "HSTS_SECONDS"),
        ({"HSTS_SECONDS": "-1"}, "HSTS_SECONDS"),
        # Each failed every rate-limited call with a 500, not the start (review136).
        ({"REDIS_URL": "redis://127.0.0.1:notaport/0"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=abc"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?no_such_option=1"}, "REDIS_URL"),
        # redis-py read these as database 0 and 1 without a word (review138).
        ({"REDIS_URL": "redis://127.0.0.1:6379/x"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0/1"}, "REDIS_URL"),
    ],
)
def test_a_bad_value_fails_at_start_up_naming_the_variable(environment, named):
    result = load_settings(**environment)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr.splitlines()[-1]


def test_an_external_database_requires_shared_secrets():
    result = load_settings(DATABASE_URL="postgres://u:p@db.example.com/recall")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_production_refuses_openai_without_a_key():
    result = load_settings(EMBEDDING_PROVIDER="openai", DEBUG="false")
    assert result.returncode != 0
    assert "OPENAI_API_KEY must be set" in result.stderr


def test_a_database_password_is_never_echoed():
    result = load_settings(DATABASE_URL="postgres://user:hunter2-secret@/db?sslmode=bogus%")
    assert "hunter2-secret" not in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2-secret@127.0.0.1:bad/0",
        # review137: cut at the "/", the password's first part was read as the port.
        "redis://:hunter2-secret/tail@127.0.0.1:6379/0",
        "rediss://:hunter2-secret@127.0.0.1:6379/0?ssl_cert_reqs=CERT_NONE",
    ],
)
def test_a_redis_password_is_never_echoed(url):
    result = load_settings(REDIS_URL=url)
    assert "REDIS_URL" in result.stderr.splitlines()[-1]
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379",
        "redis://127.0.0.1:6379/",
        "redis://127.0.0.1:6379/0/",  # redis-py reads it as database 0 (review148)
        "redis://:pw@127.0.0.1:6379/3",
        "rediss://127.0.0.1:6380/0?ssl_cert_reqs=none",
        "unix:///run/redis/redis.sock?db=2",
    ],
)
def test_a_redis_url_redis_py_reads_as_written_loads(url):
    code = "import recall.settings as s; print(s.REDIS_URL)"
    result = load_settings(code, REDIS_URL=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == url


def test_good_values_load(tmp_path):
    result = load_settings(
        DEBUG="true", HNSW_EF_SEARCH="64", RECALL_DATA_DIR=str(tmp_path), LOG_LEVEL="warn"
    )
    assert result.returncode == 0, result.stderr


def test_the_default_data_directory_is_the_xdg_one_without_spaces(tmp_path):
    code = "import recall.settings as s; print(s.RECALL_DATA_DIR)"
    home = tmp_path / "home"
    default = load_settings(code, HOME=str(home), RECALL_DATA_DIR="", XDG_DATA_HOME="")
    xdg = load_settings(
        code, HOME=str(home), RECALL_DATA_DIR="", XDG_DATA_HOME=str(tmp_path / "xdg")
    )

    assert default.stdout.strip() == str(home / ".local" / "share" / "recall"), default.stderr
    assert xdg.stdout.strip() == str(tmp_path / "xdg" / "recall"), xdg.stderr


def test_a_data_directory_with_a_space_is_fine_with_an_external_database(tmp_path):
    result = load_settings(
        RECALL_DATA_DIR=str(tmp_path / "Application Support"),
        DATABASE_URL="postgres://u:p@db.example.com/recall",
        SECRET_KEY="s",
        API_KEY_SECRET="k",
    )

    assert result.returncode == 0, result.stderr


POOLED = {
    "DATABASE_URL": "postgres://recall@pooler.example.com:6432/recall",
    "SECRET_KEY": "s",
    "API_KEY_SECRET": "a",
}
DATABASE = (
    "import json, recall.settings as s; print(json.dumps(s.DATABASES['default'], default=str))"
)


def test_transaction_pooling_sends_no_startup_options_and_prepares_nothing():
    pooled = load_settings(DATABASE, DATABASE_POOL_MODE="transaction", **POOLED)
    direct = load_settings(DATABASE, **POOLED)

    assert pooled.returncode == 0 and direct.returncode == 0, pooled.stderr + direct.stderr
    behind = json.loads(pooled.stdout)
    own = json.loads(direct.stdout)
    assert "options" not in behind["OPTIONS"]  # PgBouncer refuses a startup packet with them
    assert behind["OPTIONS"]["prepare_threshold"] is None
    assert behind["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert "-c hnsw.iterative_scan=relaxed_order" in own["OPTIONS"]["options"]


def test_transaction_pooling_makes_no_sense_on_the_embedded_database(tmp_path):
    result = load_settings(DATABASE_POOL_MODE="transaction", RECALL_DATA_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "DATABASE_POOL_MODE" in result.stderr.splitlines()[-1]


def test_a_bad_direct_url_is_named():
    result = load_settings(DATABASE_DIRECT_URL="mysql://u:p@h/db", **POOLED)
    assert result.returncode != 0
    assert "DATABASE_DIRECT_URL" in result.stderr.splitlines()[-1]


def test_the_default_worker_count_is_one_per_core():
    from core import workers

    assert [workers.default_count(n) for n in (0, 1, 2, 3, 4, 8, 64)] == [1, 1, 2, 3, 4, 8, 64]
    # What recall serve starts when WEB_CONCURRENCY is not set: this machine's figure.
    code = (
        "import os; os.environ.pop('WEB_CONCURRENCY', None); import recall.settings as s;"
        " print(s.WEB_CONCURRENCY, len(os.sched_getaffinity(0)))"
    )
    result = load_settings(code)
    assert result.returncode == 0, result.stderr
    count, cores = (int(n) for n in result.stdout.split())
    assert count == max(1, cores)


COOKIES = (
    "import json, recall.settings as s;"
    " print(json.dumps([s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE]))"
)


@pytest.mark.parametrize(
    ("public_url", "secure"),
    [("https://memory.example.com", True), ("http://localhost:8080", False)],
)
def test_cookies_are_https_only_when_the_server_is_served_over_https(tmp_path, public_url, secure):
    result = load_settings(COOKIES, RECALL_DATA_DIR=str(tmp_path), RECALL_PUBLIC_URL=public_url)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [secure, secure]


HSTS = (
    "import json, recall.settings as s; print(json.dumps("
    "[s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD]))"
)


@pytest.mark.parametrize(
    ("public_url", "configured", "seconds"),
    [
        ("https://memory.example.com", None, 31_536_000),  # a year
        ("https://memory.example.com", "600", 600),
        ("https://memory.example.com", "0", 0),
        # Over http (the local default) never: there is no https to send browsers to.
        ("http://localhost:8080", None, 0),
        ("http://localhost:8080", "600", 0),
    ],
)
def test_hsts_is_sent_only_when_the_server_is_served_over_https(
    tmp_path, public_url, configured, seconds
):
    environment = {"RECALL_DATA_DIR": str(tmp_path), "RECALL_PUBLIC_URL": public_url}
    if configured is not None:
        environment["HSTS_SECONDS"] = configured
    result = load_settings(HSTS, **environment)

    assert result.returncode == 0, result.stderr
    # For this host alone: no includeSubDomains, no preload.
    assert json.loads(result.stdout.splitlines()[-1]) == [seconds, False, False]
