"""Settings that used to pass start-up and fail later are refused as the settings load."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support import load_settings


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["not-an-email", "admin@", "@example.com", "a b@example.com"])
def test_a_malformed_admin_email_is_refused_naming_it(tmp_path, value):
    result = load_settings(RECALL_ADMIN_EMAIL=value, RECALL_DATA_DIR=str(tmp_path))

    assert result.returncode != 0
    assert "ImproperlyConfigured: RECALL_ADMIN_EMAIL must be an email address" in last_line(result)


def test_the_default_admin_email_and_a_real_one_load(tmp_path):
    for value in ("", "ops@example.com"):
        result = load_settings(RECALL_ADMIN_EMAIL=value, RECALL_DATA_DIR=str(tmp_path))
        assert result.returncode == 0, result.stderr


def recall_serve(timeout: float, **setting: str) -> subprocess.CompletedProcess[str]:
    """``recall serve`` on the embedded database (no DATABASE_URL) with ``setting`` set."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(setting)
    return subprocess.run(
        [sys.executable, "-m", "recall", "serve", "--workers", "1"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_recall_serve_refuses_a_malformed_admin_email_in_one_line(tmp_path):
    result = recall_serve(60, RECALL_ADMIN_EMAIL="not-an-email", RECALL_DATA_DIR=str(tmp_path))

    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "recall serve: configuration: RECALL_ADMIN_EMAIL must be an email address such as"
        " admin@example.com; got 'not-an-email'."
    ]


@pytest.mark.slow
def test_recall_serve_refuses_a_damaged_local_model_in_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"not an onnx graph" * 64)
    (model / "tokenizer.json").write_text('{"truncated": ')
    result = recall_serve(
        180, RECALL_LOCAL_MODEL_DIR=str(model), RECALL_DATA_DIR=str(tmp_path / "data")
    )

    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"recall serve: embedding model: The tokenizer file {model / 'tokenizer.json'}"
        " could not be read."
    )
    assert "Traceback" not in result.stderr


def test_a_local_model_dir_that_is_not_a_directory_is_refused_naming_it(tmp_path):
    result = load_settings(
        RECALL_LOCAL_MODEL_DIR=str(tmp_path / "nonexistent"), RECALL_DATA_DIR=str(tmp_path)
    )

    assert result.returncode != 0
    assert "RECALL_LOCAL_MODEL_DIR must be a directory" in last_line(result)
    assert "is not a directory" in last_line(result)


def test_a_local_model_dir_without_the_model_is_refused_naming_it(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    result = load_settings(RECALL_LOCAL_MODEL_DIR=str(empty), RECALL_DATA_DIR=str(tmp_path))

    assert result.returncode != 0
    assert "RECALL_LOCAL_MODEL_DIR must be a directory" in last_line(result)
    assert "holds no model.onnx" in last_line(result)

    (empty / "model.onnx").write_bytes(b"")
    result = load_settings(RECALL_LOCAL_MODEL_DIR=str(empty), RECALL_DATA_DIR=str(tmp_path))
    assert "holds no tokenizer.json" in last_line(result)

    (empty / "tokenizer.json").write_text("{}")
    result = load_settings(RECALL_LOCAL_MODEL_DIR=str(empty), RECALL_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "value", ["not-a-url", "ftp://example.com/v1", "https://", "http://host:port/v1"]
)
def test_an_openai_base_url_that_is_not_http_is_refused_naming_it(tmp_path, value):
    result = load_settings(OPENAI_BASE_URL=value, RECALL_DATA_DIR=str(tmp_path))

    assert result.returncode != 0
    assert "OPENAI_BASE_URL must be an http(s) URL" in last_line(result)


def test_credentials_in_an_openai_base_url_are_not_echoed(tmp_path):
    result = load_settings(
        OPENAI_BASE_URL="ftp://user:hunter2-secret@example.com/v1", RECALL_DATA_DIR=str(tmp_path)
    )

    assert "OPENAI_BASE_URL" in last_line(result)
    assert "hunter2-secret" not in result.stderr


def test_an_openai_base_url_may_be_unset_or_any_http_url(tmp_path):
    for value in ("", "http://127.0.0.1:11434/v1", "https://api.example.com/v1"):
        result = load_settings(OPENAI_BASE_URL=value, RECALL_DATA_DIR=str(tmp_path))
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("FREE_TIER_MAX_MEMORIES", "-1", "a whole number, 0 or more; got '-1'."),
        ("HNSW_MAX_SCAN_TUPLES", "5", "a whole number, 100 or more; got '5'."),
        ("HNSW_EF_SEARCH", "0", "a whole number from 1 to 1000; got '0'."),
        ("PORT", "http", "a whole number; got 'http'."),
    ],
)
def test_a_number_out_of_range_says_the_range_in_words(tmp_path, name, value, said):
    result = load_settings(**{name: value, "RECALL_DATA_DIR": str(tmp_path)})

    assert last_line(result).endswith(f"{name} must be {said}")
    assert "None" not in last_line(result)


def test_a_database_url_that_is_not_postgresql_is_one_line_without_warnings(tmp_path):
    result = load_settings(
        DATABASE_URL="notaurl", SECRET_KEY="x", API_KEY_SECRET="y", RECALL_DATA_DIR=str(tmp_path)
    )

    assert "DATABASE_URL must be a PostgreSQL URL" in last_line(result)
    assert "Warning" not in result.stderr
